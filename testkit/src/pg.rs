//! Throwaway PostgreSQL clusters.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::proc::{self, TestDir};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variable that overrides where `initdb` and `postgres` are
/// looked up.
pub const PG_BINDIR_ENV: &str = "OUTBOX_RELAY_TEST_PG_BINDIR";

/// Options for [`PgCluster::start`]. `PgOptions::default()` is the test
/// setting (fsync off).
#[derive(Clone, Debug, Default)]
pub struct PgOptions {
    /// `false` (tests): `fsync=off`, `synchronous_commit=off`,
    /// `full_page_writes=off`. `true` (benches): PostgreSQL defaults.
    pub fsync: bool,
    /// Extra `-c name=value` server settings, applied last.
    pub extra: Vec<(String, String)>,
}

impl PgOptions {
    /// Adds an extra server setting.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra.push((name.into(), value.into()));
        self
    }
}

#[derive(Debug)]
struct PgBins {
    initdb: PathBuf,
    postgres: PathBuf,
}

/// `initdb`/`postgres`: `$OUTBOX_RELAY_TEST_PG_BINDIR`, else PATH, else
/// `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`.
fn pg_bins() -> &'static PgBins {
    static BINS: OnceLock<PgBins> = OnceLock::new();
    BINS.get_or_init(|| {
        let in_dir = |dir: &Path| {
            let bins = PgBins {
                initdb: dir.join("initdb"),
                postgres: dir.join("postgres"),
            };
            (proc::is_executable(&bins.initdb) && proc::is_executable(&bins.postgres))
                .then_some(bins)
        };
        if let Some(dir) = std::env::var_os(PG_BINDIR_ENV) {
            return in_dir(Path::new(&dir)).unwrap_or_else(|| {
                panic!(
                    "${PG_BINDIR_ENV}={} has no initdb/postgres executables",
                    Path::new(&dir).display()
                )
            });
        }
        if let (Some(initdb), Some(postgres)) = (proc::which("initdb"), proc::which("postgres")) {
            return PgBins { initdb, postgres };
        }
        let pg_config_dir = Command::new("pg_config")
            .arg("--bindir")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
        if let Some(bins) = pg_config_dir.as_deref().and_then(in_dir) {
            return bins;
        }
        let mut versions: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                let version = name
                    .split('.')
                    .map(|p| p.parse::<u32>().ok())
                    .collect::<Option<Vec<u32>>>()?;
                Some((version, e.path().join("bin")))
            })
            .collect();
        versions.sort();
        versions
            .iter()
            .rev()
            .find_map(|(_, dir)| in_dir(dir))
            .unwrap_or_else(|| {
                panic!(
                    "PostgreSQL server binaries not found: no initdb+postgres on PATH, \
                     via `pg_config --bindir` or in /usr/lib/postgresql/*/bin: install \
                     Debian's `postgresql` package (`scripts/install-deps` installs every \
                     tool the tests need) or set ${PG_BINDIR_ENV}"
                )
            })
    })
}

/// (uid, gid) of the `postgres` OS user when we run as root (PostgreSQL
/// and PgBouncer refuse to run as root), else `None`.
pub(crate) fn run_as() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .unwrap_or_else(|e| panic!("looking up the `postgres` OS user failed: {e}"))
        .unwrap_or_else(|| {
            panic!(
                "running as root but there is no `postgres` OS user; PostgreSQL \
                 refuses to run as root (Debian's `postgresql` package creates the user)"
            )
        });
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

/// Runs initdb once per process into a template data dir; clusters get a
/// copy of it (much faster than one initdb each). The template's TestDir is
/// never dropped; the next run's stale-dir cleanup removes it.
fn template_data_dir() -> Result<&'static Path, String> {
    static TEMPLATE: OnceLock<Result<(TestDir, PathBuf), String>> = OnceLock::new();
    match TEMPLATE.get_or_init(|| {
        let run_as = run_as();
        let dir = TestDir::new("pgtemplate", run_as);
        let data_dir = dir.path().join("data");
        run_initdb(dir.path(), &data_dir, run_as)?;
        Ok((dir, data_dir))
    }) {
        Ok((_, data_dir)) => Ok(data_dir),
        Err(e) => Err(e.clone()),
    }
}

fn run_initdb(base: &Path, data_dir: &Path, run_as: Option<(u32, u32)>) -> Result<(), String> {
    let initdb_bin = &pg_bins().initdb;
    let log_path = base.join("initdb.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| format!("could not create {}: {e}", log_path.display()))?;
    let log2 = log
        .try_clone()
        .map_err(|e| format!("could not dup log fd: {e}"))?;
    let mut initdb = Command::new(initdb_bin);
    initdb
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
        .arg("--locale=C")
        .arg("-D")
        .arg(data_dir)
        .current_dir(base)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    if let Some((uid, gid)) = run_as {
        std::os::unix::process::CommandExt::uid(&mut initdb, uid);
        std::os::unix::process::CommandExt::gid(&mut initdb, gid);
    }
    // Via the spawner so that initdb, too, dies with the test process.
    let mut child = proc::spawn_server(initdb)
        .map_err(|e| format!("could not run {}: {e}", initdb_bin.display()))?;
    let timeout = Duration::from_secs(120);
    match proc::wait_child(&mut child, timeout) {
        Some(status) if status.success() => Ok(()),
        Some(status) => Err(format!(
            "initdb failed ({status})\n{}",
            proc::log_tail(&log_path, 40)
        )),
        None => {
            proc::kill_and_reap(&mut child);
            Err(format!(
                "initdb did not finish within {timeout:?}\n{}",
                proc::log_tail(&log_path, 40)
            ))
        }
    }
}

/// Recursively copies a (stopped) data dir, keeping permissions and giving
/// everything to `owner` if set.
fn copy_data_dir(from: &Path, to: &Path, owner: Option<(u32, u32)>) -> Result<(), String> {
    let err = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    std::fs::create_dir(to).map_err(|e| err("could not create", to, e))?;
    let meta = std::fs::metadata(from).map_err(|e| err("could not stat", from, e))?;
    std::fs::set_permissions(to, meta.permissions()).map_err(|e| err("could not chmod", to, e))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(to, Some(uid), Some(gid))
            .map_err(|e| err("could not chown", to, e))?;
    }
    for entry in std::fs::read_dir(from).map_err(|e| err("could not read", from, e))? {
        let entry = entry.map_err(|e| err("could not read", from, e))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let ty = entry
            .file_type()
            .map_err(|e| err("could not stat", &src, e))?;
        if ty.is_dir() {
            copy_data_dir(&src, &dst, owner)?;
        } else if ty.is_symlink() {
            let target =
                std::fs::read_link(&src).map_err(|e| err("could not readlink", &src, e))?;
            std::os::unix::fs::symlink(target, &dst)
                .map_err(|e| err("could not create symlink", &dst, e))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::lchown(&dst, Some(uid), Some(gid))
                    .map_err(|e| err("could not chown", &dst, e))?;
            }
        } else {
            std::fs::copy(&src, &dst).map_err(|e| err("could not copy to", &dst, e))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&dst, Some(uid), Some(gid))
                    .map_err(|e| err("could not chown", &dst, e))?;
            }
        }
    }
    Ok(())
}

/// A throwaway PostgreSQL cluster (own data dir, own port, own socket dir),
/// with trust authentication for user `postgres`. The postmaster is a direct
/// child of the test process and dies with it.
#[derive(Debug)]
pub struct PgCluster {
    // `Drop for PgCluster` stops the server before the fields (and with them
    // the TestDir and its files) are dropped.
    dir: TestDir,
    data_dir: PathBuf,
    log_path: PathBuf,
    port: u16,
    opts: PgOptions,
    run_as: Option<(u32, u32)>,
    child: Option<Child>,
}

impl PgCluster {
    /// initdb + start + wait until `SELECT 1` works. Blocking; panics with the
    /// server log tail on failure.
    pub fn start(opts: PgOptions) -> PgCluster {
        Self::try_start(opts).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_start(opts: PgOptions) -> Result<PgCluster, String> {
        let run_as = run_as();
        let dir = TestDir::new("pg", run_as);
        let data_dir = dir.path().join("data");
        let log_path = dir.path().join("postgres.log");

        copy_data_dir(template_data_dir()?, &data_dir, run_as)?;

        let mut cluster = PgCluster {
            dir,
            data_dir,
            log_path,
            port: proc::free_port(),
            opts,
            run_as,
            child: None,
        };
        cluster.try_start_again()?;
        Ok(cluster)
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/<db>`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Directory holding the unix socket (`.s.PGSQL.<port>`).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's stdout/stderr (appended to across restarts).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        proc::log_tail(&self.log_path, lines)
    }

    /// PID of the running postmaster, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Creates a fresh database `t_<counter>_<pid>` and returns its URL.
    pub async fn create_database(&self) -> String {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "t_{}_{}",
            COUNTER.fetch_add(1, Ordering::Relaxed),
            std::process::id()
        );
        let client = crate::pg_client(&self.url("postgres")).await;
        tokio::time::timeout(
            Duration::from_secs(30),
            client.batch_execute(&format!("CREATE DATABASE {name}")),
        )
        .await
        .unwrap_or_else(|_| panic!("CREATE DATABASE {name} took longer than 30s"))
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name} failed: {e}"));
        self.url(&name)
    }

    /// [`PgCluster::create_database`] with the outbox schema migrated into it.
    pub async fn create_migrated_database(&self) -> String {
        let url = self.create_database().await;
        crate::outbox::migrate_database(&url).await;
        url
    }

    /// Fast shutdown (SIGINT to the postmaster) and wait for it to exit. The
    /// postmaster exits only after all its children, so the cluster is fully
    /// down afterwards. No-op if not running.
    pub fn stop(&mut self) {
        let log_path = self.log_path.clone();
        proc::stop_server(
            &mut self.child,
            Signal::SIGINT,
            STOP_TIMEOUT,
            true,
            "postgres",
            || proc::log_tail(&log_path, 40),
        );
    }

    /// Simulates a crash: SIGKILL to the postmaster. Its backends and
    /// auxiliary processes then exit on their own (postmaster-death
    /// detection); this waits until they are gone (SIGKILLing stragglers
    /// after 10 s) and the port is free, so `start_again` can follow. No-op if
    /// not running.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        // Freeze the postmaster so it cannot fork while we list its children.
        let _ = proc::send_signal(pid, Signal::SIGSTOP);
        let children = proc::children_of(pid);
        proc::kill_and_reap(&mut child);

        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let alive: Vec<u32> = children
                .iter()
                .copied()
                .filter(|c| proc::process_alive(*c))
                .collect();
            if alive.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "[test harness] postgres children {alive:?} still alive 10s after the \
                     postmaster was killed; SIGKILLing them"
                );
                for c in &alive {
                    let _ = proc::send_signal(*c, Signal::SIGKILL);
                }
                std::thread::sleep(Duration::from_millis(100));
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !proc::wait_port_free(self.port, Duration::from_secs(10)) {
            panic!(
                "port {} still in use 10s after killing postgres (pid {pid})",
                self.port
            );
        }
    }

    /// Starts the server again on the same data dir and port and waits until
    /// it accepts queries (after `kill` this includes crash recovery).
    pub fn start_again(&mut self) {
        self.try_start_again().unwrap_or_else(|e| panic!("{e}"));
    }

    /// `stop` + `start_again`.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    fn server_command(&self) -> Command {
        let mut cmd = Command::new(&pg_bins().postgres);
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-p")
            .arg(self.port.to_string());
        let mut settings: Vec<(String, String)> = vec![
            ("listen_addresses".into(), "127.0.0.1".into()),
            (
                "unix_socket_directories".into(),
                self.dir.path().display().to_string(),
            ),
            ("max_connections".into(), "200".into()),
            // `--source wal`: logical decoding, and a slot and a walsender per test database.
            // The slots of the shared cluster outlive their tests (one per wal test database, never
            // dropped): past this limit a relay cannot create its slot and waits for ever.
            ("wal_level".into(), "logical".into()),
            ("max_wal_senders".into(), "40".into()),
            ("max_replication_slots".into(), "400".into()),
        ];
        if !self.opts.fsync {
            for name in ["fsync", "synchronous_commit", "full_page_writes"] {
                settings.push((name.into(), "off".into()));
            }
            // With asynchronous commits the walsender sends a commit only once the WAL writer
            // flushed it: every `wal_writer_delay` (200 ms by default), which the wal source's
            // tests would wait for on every commit.
            settings.push(("wal_writer_delay".into(), "10ms".into()));
        }
        settings.extend(self.opts.extra.iter().cloned());
        for (name, value) in settings {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        cmd
    }

    fn try_start_again(&mut self) -> Result<(), String> {
        assert!(
            self.child.is_none(),
            "PgCluster::start_again called while postgres (pid {:?}) is running",
            self.pid()
        );
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let log_start = proc::file_len(&self.log_path);
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log_path)
                .map_err(|e| format!("could not open {}: {e}", self.log_path.display()))?;
            let log2 = log
                .try_clone()
                .map_err(|e| format!("could not dup log fd: {e}"))?;
            let mut cmd = self.server_command();
            cmd.stdout(log).stderr(log2);
            let child = proc::spawn_server(cmd)
                .map_err(|e| format!("could not spawn {}: {e}", pg_bins().postgres.display()))?;
            self.child = Some(child);

            match self.wait_ready(deadline) {
                Ok(()) => return Ok(()),
                Err(ReadyError::Exited(status)) => {
                    self.child = None;
                    let log = proc::read_from(&self.log_path, log_start);
                    // Leftovers of a killed server may still hold the shared
                    // memory segment / lock file for a moment: retry.
                    let transient = log.contains("pre-existing shared memory block")
                        || log.contains("lock file")
                        || log.contains("could not bind");
                    if transient && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    return Err(format!(
                        "postgres on port {} exited during startup ({status})\n{}",
                        self.port,
                        self.log_tail(40)
                    ));
                }
                Err(ReadyError::Timeout) => {
                    if let Some(mut child) = self.child.take() {
                        proc::kill_and_reap(&mut child);
                    }
                    return Err(format!(
                        "postgres on port {} not ready within {READY_TIMEOUT:?}\n{}",
                        self.port,
                        self.log_tail(40)
                    ));
                }
            }
        }
    }

    fn wait_ready(&mut self, deadline: Instant) -> Result<(), ReadyError> {
        let url = self.url("postgres");
        loop {
            let child = self.child.as_mut().expect("postgres child");
            if let Ok(Some(status)) = child.try_wait() {
                return Err(ReadyError::Exited(status));
            }
            if proc::port_accepts(self.port) {
                let url = url.clone();
                let ok = proc::probe(Duration::from_secs(2), async move {
                    let Ok((client, conn)) =
                        tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                    else {
                        return false;
                    };
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    client.simple_query("SELECT 1").await.is_ok()
                });
                if ok {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(ReadyError::Timeout);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

enum ReadyError {
    Exited(std::process::ExitStatus),
    Timeout,
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown: the postmaster SIGQUITs its children and
            // waits for them.
            proc::signal_and_wait(&mut child, Signal::SIGQUIT, Duration::from_secs(5), true);
        }
        // self.dir (TestDir) removes the files afterwards.
    }
}

/// The per-test-binary shared cluster (fsync off, connections logged), started on first use.
/// Never dropped: the server dies with the test process (parent-death
/// signal) and its temp dir is removed by the next run.
pub fn shared_pg() -> &'static PgCluster {
    static SHARED: OnceLock<Result<PgCluster, String>> = OnceLock::new();
    match SHARED
        .get_or_init(|| PgCluster::try_start(PgOptions::default().setting("log_connections", "on")))
    {
        Ok(cluster) => cluster,
        Err(e) => panic!("the shared PostgreSQL cluster failed to start:\n{e}"),
    }
}
