//! Throwaway PgBouncer instances in front of a [`PgCluster`], in transaction pooling mode.

use std::path::{Path, PathBuf};

use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::pg::{self, PgCluster};
use crate::proc::{self, TestDir};

const READY_TIMEOUT: Duration = Duration::from_secs(15);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Environment variable that overrides the pgbouncer binary.
pub const PGBOUNCER_ENV: &str = "OUTBOX_RELAY_TEST_PGBOUNCER";

/// `$OUTBOX_RELAY_TEST_PGBOUNCER`, else `pgbouncer` on PATH, else `/usr/sbin/pgbouncer` (where
/// Debian's package puts it, off a normal user's PATH).
fn pgbouncer_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        proc::find_bin(
            PGBOUNCER_ENV,
            "pgbouncer",
            &format!(
                "pgbouncer not found on PATH or in /usr/sbin: install Debian's `pgbouncer` \
                 package (`scripts/install-deps` installs every tool the tests need) or set \
                 ${PGBOUNCER_ENV}"
            ),
        )
    })
}

/// Options for [`PgBouncer::start_with`]. The default is what the tests need: transaction pooling,
/// two server connections per database and user, trust authentication for `postgres`.
#[derive(Clone, Debug)]
pub struct PgBouncerOptions {
    /// `pool_mode` (`transaction`, `session` or `statement`).
    pub pool_mode: String,
    /// `default_pool_size`: server connections per (database, user).
    pub pool_size: u32,
    /// Users besides `postgres` that may log in (trust authentication still needs them listed).
    pub users: Vec<String>,
    /// Extra `name = value` settings of the `[pgbouncer]` section, written last.
    pub extra: Vec<(String, String)>,
}

impl Default for PgBouncerOptions {
    fn default() -> Self {
        PgBouncerOptions {
            pool_mode: "transaction".into(),
            pool_size: 2,
            users: Vec::new(),
            extra: Vec::new(),
        }
    }
}

impl PgBouncerOptions {
    /// Lets `user` log in too.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.users.push(user.into());
        self
    }

    /// Adds an extra `[pgbouncer]` setting.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra.push((name.into(), value.into()));
        self
    }
}

/// A throwaway PgBouncer listening on 127.0.0.1 and forwarding every database name to one
/// [`PgCluster`] (a `*` fallback entry, so databases created later work too). A direct child of
/// the test process that dies with it; runs as the `postgres` OS user when the tests run as root
/// (PgBouncer refuses to run as root).
///
/// Clients send no `options` through it: PgBouncer refuses unknown startup parameters, and only
/// `extra_float_digits` (sent by sqlx and JDBC) is ignored on purpose.
#[derive(Debug)]
pub struct PgBouncer {
    // `Drop for PgBouncer` kills the process before the TestDir is removed.
    dir: TestDir,
    ini_path: PathBuf,
    run_as: Option<(u32, u32)>,
    server: proc::Server,
}

impl PgBouncer {
    /// [`PgBouncer::start_with`] the default options.
    pub fn start(cluster: &PgCluster) -> PgBouncer {
        Self::start_with(cluster, PgBouncerOptions::default())
    }

    /// Writes the ini and user list into a temp dir, starts pgbouncer on a free port and waits
    /// (bounded) until `SELECT 1` through it works. Blocking; panics with the log tail on failure.
    pub fn start_with(cluster: &PgCluster, opts: PgBouncerOptions) -> PgBouncer {
        let run_as = pg::run_as();
        let dir = TestDir::new("pgbouncer", run_as);
        let port = proc::free_port();
        let ini_path = dir.path().join("pgbouncer.ini");
        let log_path = dir.path().join("pgbouncer.log");
        let userlist = dir.path().join("userlist.txt");

        let mut users = vec!["postgres".to_string()];
        users.extend(opts.users.iter().cloned());
        let userlist_text: String = users.iter().map(|u| format!("\"{u}\" \"\"\n")).collect();
        write_file(&userlist, &userlist_text);

        let mut settings: Vec<(String, String)> = vec![
            ("listen_addr".into(), "127.0.0.1".into()),
            ("listen_port".into(), port.to_string()),
            ("unix_socket_dir".into(), dir.path().display().to_string()),
            ("auth_type".into(), "trust".into()),
            ("auth_file".into(), userlist.display().to_string()),
            ("admin_users".into(), "postgres".into()),
            ("pool_mode".into(), opts.pool_mode.clone()),
            ("default_pool_size".into(), opts.pool_size.to_string()),
            ("max_client_conn".into(), "500".into()),
            // sqlx and JDBC send it; tokio-postgres sends nothing PgBouncer would refuse.
            (
                "ignore_startup_parameters".into(),
                "extra_float_digits".into(),
            ),
            ("logfile".into(), log_path.display().to_string()),
            ("log_connections".into(), "0".into()),
            ("log_disconnections".into(), "0".into()),
        ];
        settings.extend(opts.extra.iter().cloned());
        let mut ini = format!(
            "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\n",
            cluster.port()
        );
        for (name, value) in settings {
            ini.push_str(&format!("{name} = {value}\n"));
        }
        write_file(&ini_path, &ini);

        let stdio_path = dir.path().join("pgbouncer-stdio.log");
        let mut bouncer = PgBouncer {
            dir,
            ini_path,
            run_as,
            server: proc::Server::new("pgbouncer", pgbouncer_bin(), port, log_path, stdio_path),
        };
        bouncer.start_again();
        bouncer
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// `postgres://postgres@127.0.0.1:PORT/<db>`: `db` of the fronted cluster, through the pooler.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port())
    }

    /// The same database as `cluster_url` (a URL of the fronted cluster, as
    /// [`PgCluster::create_database`] returns), through the pooler.
    pub fn url_for(&self, cluster_url: &str) -> String {
        let db = cluster_url.rsplit('/').next().unwrap_or("postgres");
        self.url(db)
    }

    /// The admin console (`SHOW POOLS`, `SHOW SERVERS`, ...; simple queries only).
    pub fn admin_url(&self) -> String {
        self.url("pgbouncer")
    }

    pub fn ini_path(&self) -> &Path {
        &self.ini_path
    }

    pub fn log_path(&self) -> &Path {
        self.server.log_path()
    }

    /// The last `lines` lines of the log (plus stdout/stderr).
    pub fn log_tail(&self, lines: usize) -> String {
        self.server.log_tail(lines)
    }

    /// PID of the running pgbouncer, if any.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// SIGKILL (every client and server connection breaks) and wait until the port is free.
    /// No-op if not running.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Starts pgbouncer again with the same port and ini and waits until it forwards queries.
    pub fn start_again(&mut self) {
        let url = self.url("postgres");
        let args = [self.ini_path.clone().into_os_string()];
        self.server
            .start(&args, self.dir.path(), self.run_as, READY_TIMEOUT, || {
                probe_select_one(&url)
            });
    }
}

/// `SELECT 1` through the pooler (so the server behind it answers too), bounded to 2 s.
fn probe_select_one(url: &str) -> bool {
    let url = url.to_string();
    proc::probe(Duration::from_secs(2), async move {
        let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await else {
            return false;
        };
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client.simple_query("SELECT 1").await.is_ok()
    })
}

fn write_file(path: &Path, text: &str) {
    std::fs::write(path, text)
        .unwrap_or_else(|e| panic!("could not write {}: {e}", path.display()));
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // SIGTERM: immediate shutdown (SIGINT would wait for the clients to finish).
        self.server.shut_down(Signal::SIGTERM, STOP_TIMEOUT);
        // self.dir (TestDir) removes the files afterwards.
    }
}
