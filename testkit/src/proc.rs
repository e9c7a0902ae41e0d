//! Process, port and temp-dir plumbing shared by the PostgreSQL and NATS
//! helpers.

use std::ffi::{OsStr, OsString};
use std::fs::OpenOptions;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// Prefix of every temp dir created by the harness:
/// `outbox-relay-test-<pid>-<n>-<kind>` under `std::env::temp_dir()`.
const DIR_PREFIX: &str = "outbox-relay-test-";

// ---------------------------------------------------------------------------
// Spawner thread
// ---------------------------------------------------------------------------

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// The sending side of the spawner thread's queue. The thread is started on
/// first use and never exits (the sender lives in a static), so the parent of
/// every server process is a thread that lives as long as the test process:
/// PR_SET_PDEATHSIG fires when the *forking thread* exits, and cargo test runs
/// each test on a thread of its own.
fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static TX: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("test-server-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("could not start the test-server spawner thread");
        tx
    })
}

/// Spawns a long-lived server process that is SIGKILLed as soon as the test
/// process dies. The fork happens on the dedicated spawner thread.
pub(crate) fn spawn_server(mut cmd: Command) -> io::Result<Child> {
    let parent = std::process::id();
    // SAFETY: the closure only performs async-signal-safe system calls
    // (prctl, getppid) and does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            // Runs after std has applied uid/gid (changing credentials clears
            // the parent-death signal, so it must be set afterwards).
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may already have died before prctl took effect.
            if nix::unistd::getppid().as_raw() as u32 != parent {
                return Err(Errno::ESRCH.into());
            }
            Ok(())
        });
    }
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner()
        .send((cmd, reply_tx))
        .expect("test-server spawner thread is gone");
    reply_rx
        .recv()
        .expect("test-server spawner thread dropped the request")
}

// ---------------------------------------------------------------------------
// Child process helpers
// ---------------------------------------------------------------------------

pub(crate) fn send_signal(pid: u32, sig: Signal) -> nix::Result<()> {
    signal::kill(Pid::from_raw(pid as i32), sig)
}

/// Waits for `child` to exit, polling every 10 ms, for at most `timeout`.
pub(crate) fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(e) => panic!("waitpid({}) failed: {e}", child.id()),
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILLs `child` and reaps it.
pub(crate) fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends `sig` to `child` and waits up to `timeout` for it to exit. When it does not, SIGKILLs it
/// (and with `with_children` the children it had then) and returns `None`.
pub(crate) fn signal_and_wait(
    child: &mut Child,
    sig: Signal,
    timeout: Duration,
    with_children: bool,
) -> Option<ExitStatus> {
    let _ = send_signal(child.id(), sig);
    if let Some(status) = wait_child(child, timeout) {
        return Some(status);
    }
    let children = if with_children {
        children_of(child.id())
    } else {
        Vec::new()
    };
    kill_and_reap(child);
    for c in children {
        let _ = send_signal(c, Signal::SIGKILL);
    }
    None
}

/// Graceful stop of the server in `child` (no-op if not running): `sig`, then a bounded wait.
/// Panics with `log_tail` when it had to be killed.
pub(crate) fn stop_server(
    child: &mut Option<Child>,
    sig: Signal,
    timeout: Duration,
    with_children: bool,
    what: &str,
    log_tail: impl FnOnce() -> String,
) {
    let Some(mut child) = child.take() else {
        return;
    };
    if signal_and_wait(&mut child, sig, timeout, with_children).is_none() {
        panic!(
            "{what} (pid {}) did not stop within {timeout:?} after {sig}; killed it\n{}",
            child.id(),
            log_tail()
        );
    }
}

/// Whether the process `pid` exists and is not a zombie.
pub(crate) fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => proc_stat_fields(&stat).is_some_and(|(state, _)| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// (state, ppid) from the text of /proc/<pid>/stat.
fn proc_stat_fields(stat: &str) -> Option<(&str, u32)> {
    // The command name may contain spaces and parentheses; it ends at the
    // last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// PIDs of the live direct children of `parent`.
pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| proc_stat_fields(&s).map(|(st, ppid)| ppid == parent && st != "Z"))
                .unwrap_or(false)
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Ports
// ---------------------------------------------------------------------------

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("could not bind 127.0.0.1:0 to find a free port")
        .port()
}

pub(crate) fn port_accepts(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Whether 127.0.0.1:`port` can be bound (std sets SO_REUSEADDR, so sockets
/// in TIME_WAIT do not count).
pub(crate) fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

pub(crate) fn wait_port_free(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if port_is_free(port) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// Async probes from blocking code
// ---------------------------------------------------------------------------

/// Runs `fut` on a private, process-wide tokio runtime and blocks the calling
/// thread for the result (bounded by `timeout`; `false` on timeout). Usable
/// from plain threads and from inside other runtimes alike.
pub(crate) fn probe<F>(timeout: Duration, fut: F) -> bool
where
    F: Future<Output = bool> + Send + 'static,
{
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let rt = RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("test-harness-probe")
            .enable_all()
            .build()
            .expect("could not build the harness probe runtime")
    });
    let (tx, rx) = mpsc::channel();
    rt.spawn(async move {
        let ok = tokio::time::timeout(timeout, fut).await.unwrap_or(false);
        let _ = tx.send(ok);
    });
    rx.recv_timeout(timeout + Duration::from_secs(1))
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------
// Temp dirs
// ---------------------------------------------------------------------------

/// A private temp dir `outbox-relay-test-<pid>-<n>-<kind>`, removed on drop.
#[derive(Debug)]
pub(crate) struct TestDir {
    path: PathBuf,
}

impl TestDir {
    /// Creates the dir with mode 0700, owned by `owner` (uid, gid) if given.
    pub(crate) fn new(kind: &str, owner: Option<(u32, u32)>) -> TestDir {
        static CLEANUP: Once = Once::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        CLEANUP.call_once(remove_stale_dirs);

        let base = std::env::temp_dir();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("{DIR_PREFIX}{}-{n}-{kind}", std::process::id()));
        // A leftover from an earlier process that had the same pid.
        if path.exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("could not create temp dir {}: {e}", path.display()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
            .unwrap_or_else(|e| panic!("could not chmod {}: {e}", path.display()));
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap_or_else(|e| {
                panic!("could not chown {} to {uid}:{gid}: {e}", path.display())
            });
        }
        TestDir { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes temp dirs of earlier runs whose owning process is gone. Their
/// servers died with them (parent-death signal).
fn remove_stale_dirs() {
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == own {
            continue;
        }
        // ESRCH: no such process. EPERM means it exists (another user).
        if signal::kill(Pid::from_raw(pid as i32), None) == Err(Errno::ESRCH) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

// ---------------------------------------------------------------------------
// Misc
// ---------------------------------------------------------------------------

/// A server binary: `$<env>`, else `name` on PATH, else `/usr/sbin/<name>` (where Debian puts
/// server packages, off a normal user's PATH) or `/usr/local/bin/<name>`. Panics with `missing`.
pub(crate) fn find_bin(env: &str, name: &str, missing: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    which(name)
        .or_else(|| {
            ["/usr/sbin", "/usr/local/bin"]
                .iter()
                .map(|dir| Path::new(dir).join(name))
                .find(|p| is_executable(p))
        })
        .unwrap_or_else(|| panic!("{missing}"))
}

/// Finds an executable `name` on PATH.
pub(crate) fn which(name: impl AsRef<OsStr>) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name.as_ref()))
        .find(|p| is_executable(p))
}

pub fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// The log text written after byte `from`.
pub fn read_from(p: &Path, from: u64) -> String {
    let bytes = std::fs::read(p).unwrap_or_default();
    let from = (from as usize).min(bytes.len());
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}

/// The last `lines` lines of the file at `p`, for panic messages.
pub(crate) fn log_tail(p: &Path, lines: usize) -> String {
    match std::fs::read(p) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            let start = all.len().saturating_sub(lines);
            let mut out = format!(
                "--- last {} lines of {} ---\n",
                all.len() - start,
                p.display()
            );
            for l in &all[start..] {
                out.push_str(l);
                out.push('\n');
            }
            out
        }
        Err(e) => format!("(could not read {}: {e})", p.display()),
    }
}

/// The last `lines` lines of a server's log, plus those of its captured stdout/stderr if any.
pub(crate) fn server_log_tail(log: &Path, stdio: &Path, lines: usize) -> String {
    let mut s = log_tail(log, lines);
    if file_len(stdio) > 0 {
        s.push_str(&log_tail(stdio, lines));
    }
    s
}

/// SIGKILLs the server in `child` (if running), reaps it and waits until `port` is free.
pub(crate) fn kill_server(child: &mut Option<Child>, port: u16, what: &str) {
    let Some(mut child) = child.take() else {
        return;
    };
    kill_and_reap(&mut child);
    expect_port_free(port, what);
}

/// A server process of the harness (nats-server, PgBouncer): its child, port and log files. Dropping
/// it does not stop the process; its owner does that in its own `Drop`.
#[derive(Debug)]
pub(crate) struct Server {
    /// The program's name, for messages.
    what: &'static str,
    bin: PathBuf,
    port: u16,
    /// The log the server writes itself.
    log_path: PathBuf,
    /// Its stdout and stderr, appended to across restarts.
    stdio_path: PathBuf,
    child: Option<Child>,
}

impl Server {
    pub(crate) fn new(
        what: &'static str,
        bin: &Path,
        port: u16,
        log_path: PathBuf,
        stdio_path: PathBuf,
    ) -> Server {
        Server {
            what,
            bin: bin.to_path_buf(),
            port,
            log_path,
            stdio_path,
            child: None,
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn log_path(&self) -> &Path {
        &self.log_path
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `lines` lines of the server's log, plus those of its stdout/stderr if any.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        server_log_tail(&self.log_path, &self.stdio_path, lines)
    }

    /// SIGKILL and wait until the process is reaped and the port is free. No-op if not running.
    pub(crate) fn kill(&mut self) {
        kill_server(&mut self.child, self.port, self.what);
    }

    /// [`stop_server`] with `sig`, panicking with the log tail when it had to be killed.
    pub(crate) fn stop(&mut self, sig: Signal, timeout: Duration) {
        let (log_path, stdio_path) = (self.log_path.clone(), self.stdio_path.clone());
        stop_server(&mut self.child, sig, timeout, false, self.what, || {
            server_log_tail(&log_path, &stdio_path, 40)
        });
    }

    /// `sig`, a bounded wait, then SIGKILL: for `Drop`.
    pub(crate) fn shut_down(&mut self, sig: Signal, timeout: Duration) {
        if let Some(mut child) = self.child.take() {
            signal_and_wait(&mut child, sig, timeout, false);
        }
    }

    /// Starts `args` with stdout and stderr appended to the stdio file (as `run_as`, if set), and
    /// waits until `ready` says so. Panics with the log tail when the server exits or is not ready
    /// within `timeout`.
    pub(crate) fn start(
        &mut self,
        args: &[OsString],
        dir: &Path,
        run_as: Option<(u32, u32)>,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) {
        let what = self.what;
        assert!(
            self.child.is_none(),
            "{what} (pid {:?}) started while it is running",
            self.pid()
        );
        let stdio = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stdio_path)
            .unwrap_or_else(|e| panic!("could not open {}: {e}", self.stdio_path.display()));
        let stdio2 = stdio.try_clone().expect("could not dup log fd");
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stdio2);
        if let Some((uid, gid)) = run_as {
            cmd.uid(uid).gid(gid);
        }
        let child = spawn_server(cmd)
            .unwrap_or_else(|e| panic!("could not spawn {}: {e}", self.bin.display()));
        self.child = Some(child);

        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("server child");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                panic!(
                    "{what} on port {} exited during startup ({status})\n{}",
                    self.port,
                    self.log_tail(40)
                );
            }
            if port_accepts(self.port) && ready() {
                return;
            }
            if Instant::now() >= deadline {
                if let Some(mut child) = self.child.take() {
                    kill_and_reap(&mut child);
                }
                panic!(
                    "{what} on port {} not ready within {timeout:?}\n{}",
                    self.port,
                    self.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Panics unless `port` is free within 10 s of `what` exiting.
pub(crate) fn expect_port_free(port: u16, what: &str) {
    if !wait_port_free(port, Duration::from_secs(10)) {
        panic!("port {port} still in use 10s after {what} exited");
    }
}
