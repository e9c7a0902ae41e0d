//! The relay as the CLI binary in a child process: for the tests that kill it or send it signals,
//! and for the benches.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::proc;

/// Environment variable that overrides the relay binary the harness runs.
pub const RELAY_BIN_ENV: &str = "OUTBOX_RELAY_TEST_BIN";

/// How long a relay may take to exit after SIGTERM.
const TERM_TIMEOUT: Duration = Duration::from_secs(15);

/// The `outbox-relay` binary of this build: `$OUTBOX_RELAY_TEST_BIN`, else the one cargo built
/// next to the running test or bench executable (`target/<profile>/outbox-relay`, one level above
/// `target/<profile>/deps/<test binary>`). Cargo builds it before any integration test or bench of
/// the package runs.
pub fn relay_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os(RELAY_BIN_ENV) {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("the path of the running executable");
        let dir = exe.parent().expect("the executable's directory");
        let profile_dir = if dir.file_name().is_some_and(|n| n == "deps") {
            dir.parent().expect("target/<profile>")
        } else {
            dir
        };
        let bin = profile_dir.join(format!("outbox-relay{}", std::env::consts::EXE_SUFFIX));
        assert!(
            proc::is_executable(&bin),
            "{} is not there: run the tests and benches through cargo (which builds it first), or \
             set ${RELAY_BIN_ENV}",
            bin.display()
        );
        bin
    })
}

/// `outbox-relay` with no arguments yet.
pub fn relay_command() -> Command {
    Command::new(relay_bin())
}

/// A relay (or any outbox-relay command) in a child process. It is killed on drop, and by the
/// kernel when the test or bench process dies (it is forked like the servers).
#[derive(Debug)]
pub struct RelayProcess {
    name: String,
    child: Child,
    /// Where its stderr goes, if to a file.
    log: Option<PathBuf>,
}

impl RelayProcess {
    /// Spawns `cmd` (stdin, stdout and stderr as the caller set them). `name` tells relays apart
    /// in messages; `log` is the file the caller sent stderr to, if any.
    pub fn spawn(name: &str, cmd: Command, log: Option<PathBuf>) -> std::io::Result<RelayProcess> {
        let child = proc::spawn_server(cmd)?;
        Ok(RelayProcess {
            name: name.into(),
            child,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status if it has exited (reaping it), else `None`.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("waitpid of the relay")
    }

    /// SIGKILL and reap.
    pub fn kill(mut self) {
        proc::kill_and_reap(&mut self.child);
    }

    /// Sends SIGTERM and returns the exit code; panics unless it exits within 15 s.
    pub fn terminate(self) -> Option<i32> {
        self.terminate_within(TERM_TIMEOUT)
    }

    /// Sends SIGTERM and returns the exit code; panics unless it exits within `limit`.
    pub fn terminate_within(mut self, limit: Duration) -> Option<i32> {
        match proc::signal_and_wait(&mut self.child, Signal::SIGTERM, limit, false) {
            Some(status) => status.code(),
            None => panic!("relay did not exit within {limit:?} of SIGTERM"),
        }
    }

    /// Sends SIGTERM and waits up to `limit`: `Ok(exit code)`, or `Err` when it was still running
    /// then (it is killed); with its whole log either way.
    pub fn terminate_logged(mut self, limit: Duration) -> (Result<Option<i32>, ()>, String) {
        let exit = match proc::signal_and_wait(&mut self.child, Signal::SIGTERM, limit, false) {
            Some(status) => Ok(status.code()),
            None => {
                proc::kill_and_reap(&mut self.child);
                Err(())
            }
        };
        (exit, self.log())
    }

    /// SIGTERM and wait (15 s, then SIGKILL), off the async runtime's threads. Returns a note when
    /// the exit was not clean.
    pub async fn stop(mut self) -> Option<String> {
        tokio::task::spawn_blocking(move || {
            match proc::signal_and_wait(&mut self.child, Signal::SIGTERM, TERM_TIMEOUT, false) {
                Some(status) if status.success() => None,
                Some(status) => Some(format!(
                    "relay {} exited with {status}: {}",
                    self.name,
                    self.log_tail()
                )),
                None => Some(format!(
                    "relay {} ignored SIGTERM for 15 s (killed)",
                    self.name
                )),
            }
        })
        .await
        .unwrap_or_else(|e| Some(format!("waiting for the relay failed: {e}")))
    }

    /// Its whole log file (empty without one).
    pub fn log(&self) -> String {
        self.log
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// The last 10 lines of its log file joined on one line (empty without a log file).
    pub fn log_tail(&self) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join(" / ")
    }

    /// An error when the relay has exited (it must run until it is stopped).
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "relay {} exited early ({status}): {}",
                self.name,
                self.log_tail()
            )),
            Err(e) => Err(format!("waitpid of relay {}: {e}", self.name)),
        }
    }

    /// Peak resident set size (VmHWM) in MiB.
    pub fn peak_rss_mb(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb / 1024.0)
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            proc::kill_and_reap(&mut self.child);
        }
    }
}
