//! Outbox-specific test support on top of the server harness: a migrated database, a stream, relays
//! in-process or as the CLI binary, and readers of what reached the stream.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use outbox_relay::{Relay, RelayConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::relay::{relay_command, RelayProcess};
use crate::{pg_client, shared_pg, wait_until, NatsServer, PgCluster};

pub const STREAM: &str = "OUTBOX";

/// A fresh migrated database and a nats-server of its own with the `OUTBOX` stream.
pub struct Env {
    pub db: String,
    pub nats: NatsServer,
}

/// One message as stored in the stream.
#[derive(Debug, Clone)]
pub struct Stored {
    pub seq: u64,
    pub subject: String,
    pub headers: HashMap<String, String>,
    pub payload: String,
}

impl Stored {
    /// A message read from the stream (first value of each header).
    pub fn from_message(msg: &async_nats::jetstream::Message) -> Stored {
        let headers = msg
            .headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            v.first().map(|v| v.to_string()).unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Stored {
            seq: msg.info().expect("message info").stream_sequence,
            subject: msg.subject.to_string(),
            headers,
            payload: String::from_utf8_lossy(&msg.payload).into_owned(),
        }
    }

    pub fn event_id(&self) -> Uuid {
        Uuid::parse_str(&self.headers["Outbox-Event-Id"]).expect("Outbox-Event-Id is a uuid")
    }
}

/// `migrate --wal`'s publication in the database at `url`.
pub async fn create_publication(url: &str) {
    let mut client = pg_client(url).await;
    outbox_relay::ops::Outbox::new(&mut client, None)
        .create_publication()
        .await
        .unwrap_or_else(|e| panic!("creating the publication in {url} failed: {e}"));
}

/// Migrates the outbox schema into the database at `url` (bounded to 60 s).
pub async fn migrate_database(url: &str) {
    let mut client = pg_client(url).await;
    tokio::time::timeout(
        Duration::from_secs(60),
        outbox_relay::ops::Outbox::new(&mut client, None).migrate(),
    )
    .await
    .unwrap_or_else(|_| panic!("migrating {url} took longer than 60s"))
    .unwrap_or_else(|e| panic!("migrating {url} failed: {e}"));
}

impl Env {
    /// A database of the shared cluster, its own nats-server and the stream.
    pub async fn new() -> Env {
        Env::on(shared_pg()).await
    }

    /// A database of `pg`, its own nats-server and the stream.
    pub async fn on(pg: &PgCluster) -> Env {
        let env = Env::without_stream(pg).await;
        env.create_stream().await;
        env
    }

    /// A database of `pg` and its own nats-server, without a stream.
    pub async fn without_stream(pg: &PgCluster) -> Env {
        let db = pg.create_migrated_database().await;
        let nats = NatsServer::start();
        Env { db, nats }
    }

    pub async fn create_stream(&self) {
        create_stream(&self.js().await).await;
    }

    pub async fn js(&self) -> jetstream::Context {
        let client = async_nats::connect(self.nats.url())
            .await
            .expect("connect to nats");
        jetstream::new(client)
    }

    /// Defaults for tests: a fast retry, no metrics listener, a long fallback so that tests notice
    /// when a wake-up depends on it.
    pub fn config(&self) -> RelayConfig {
        let mut config = RelayConfig::new(self.db.clone());
        config.nats.url = self.nats.url().into();
        config.source.fallback_interval = Duration::from_secs(60);
        config.retry.initial = Duration::from_millis(100);
        config.retry.max = Duration::from_secs(1);
        config.publish.timeout = Duration::from_secs(2);
        config
    }

    /// [`Env::config`] for `--source wal`, with a slot named after the database (slots are
    /// cluster-wide; each test database gets its own), and the publication created. Published
    /// rows are deleted (`--wal-marking delete`): a trigger keeps every written row's key in
    /// `written_ledger` for [`Env::written`].
    pub async fn wal_config(&self) -> RelayConfig {
        create_publication(&self.db).await;
        self.client()
            .await
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS written_ledger (
                     id uuid PRIMARY KEY, seq bigint, aggregate_type text, aggregate_id text);
                 INSERT INTO written_ledger SELECT id, seq, aggregate_type, aggregate_id
                     FROM outbox_events ON CONFLICT DO NOTHING;
                 CREATE OR REPLACE FUNCTION written_ledger_keep() RETURNS trigger
                 LANGUAGE plpgsql AS $$
                 BEGIN
                     INSERT INTO written_ledger VALUES (NEW.id, NEW.seq, NEW.aggregate_type, NEW.aggregate_id);
                     RETURN NULL;
                 END $$;
                 CREATE OR REPLACE TRIGGER written_ledger_keep AFTER INSERT ON outbox_events
                     FOR EACH ROW EXECUTE FUNCTION written_ledger_keep();",
            )
            .await
            .expect("the written ledger");
        let mut config = self.config();
        config.source.source = outbox_relay::Source::Wal;
        config.wal.slot_name = Some(self.slot_name());
        config
    }

    /// The config of `source`, ready to relay what is written from now on: for `Source::Wal`,
    /// [`Env::wal_config`] with the slot created and its catch-up marked done, so that rows
    /// written next are streamed (not caught up from the table).
    pub async fn source_config(&self, source: outbox_relay::Source) -> RelayConfig {
        match source {
            outbox_relay::Source::Notify => self.config(),
            outbox_relay::Source::Wal => {
                let config = self.wal_config().await;
                let slot = self.slot_name();
                let client = self.client().await;
                client
                    .execute(
                        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')
                         WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)",
                        &[&slot],
                    )
                    .await
                    .expect("create the slot");
                client
                    .execute(
                        "INSERT INTO outbox_wal_slots (slot_name, caught_up_at) VALUES ($1, now())
                         ON CONFLICT (slot_name) DO UPDATE SET caught_up_at = now()",
                        &[&slot],
                    )
                    .await
                    .expect("mark the slot caught up");
                config
            }
        }
    }

    /// The CLI arguments of `source` for a relay of [`Env::source_config`].
    pub fn source_args(&self, source: outbox_relay::Source) -> Vec<String> {
        match source {
            outbox_relay::Source::Notify => Vec::new(),
            outbox_relay::Source::Wal => vec![
                "--source".into(),
                "wal".into(),
                "--slot-name".into(),
                self.slot_name(),
            ],
        }
    }

    /// The slot [`Env::wal_config`] names: the database's name.
    pub fn slot_name(&self) -> String {
        self.db
            .rsplit('/')
            .next()
            .unwrap_or("outbox_relay")
            .to_string()
    }

    pub async fn spawn(&self, config: RelayConfig) -> RunningRelay {
        RunningRelay::start(config).await
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        pg_client(&self.db).await
    }

    /// Inserts with the classic writer SQL, `n` rows in one transaction.
    pub async fn insert_sql(&self, n: usize, aggregate_id: &str, event_type: &str) {
        let client = self.client().await;
        client
            .execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', $1, $2, jsonb_build_object('n', g) FROM generate_series(1, $3::int) g",
                &[&aggregate_id, &event_type, &(n as i32)],
            )
            .await
            .expect("insert");
    }

    /// Terminates this database's backends whose `application_name` is LIKE `pattern`; returns
    /// how many.
    pub async fn terminate_backends(&self, pattern: &str) -> i64 {
        self.client()
            .await
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name LIKE $1",
                &[&pattern],
            )
            .await
            .expect("terminate backends")
            .get(0)
    }

    pub async fn count(&self, where_clause: &str) -> i64 {
        let client = self.client().await;
        client
            .query_one(
                &format!("SELECT count(*) FROM outbox_events WHERE {where_clause}"),
                &[],
            )
            .await
            .expect("count")
            .get(0)
    }

    pub async fn stream_len(&self) -> u64 {
        let js = self.js().await;
        let mut s = js.get_stream(STREAM).await.expect("stream");
        s.info().await.expect("stream info").state.messages
    }

    pub async fn wait_stream_len(&self, n: u64, timeout: Duration) {
        wait_until(&format!("{n} messages in the stream"), timeout, || async {
            self.stream_len().await >= n
        })
        .await;
    }

    /// Waits until `sql` (one boolean column, one row) with `params` answers true, naming `what`
    /// on a timeout.
    pub async fn wait_true(
        &self,
        what: &str,
        timeout: Duration,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) {
        let client = self.client().await;
        wait_until(what, timeout, || async {
            client
                .query_one(sql, params)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .get(0)
        })
        .await;
    }

    /// Waits until `n` rows are dead-lettered (exactly: one more fails at once).
    pub async fn wait_dead_letters(&self, n: i64, timeout: Duration) {
        wait_until(&format!("{n} rows dead-lettered"), timeout, || async {
            let dead = self.count("dead_lettered_at IS NOT NULL").await;
            assert!(dead <= n, "{dead} rows dead-lettered, expected {n}");
            dead == n
        })
        .await;
    }

    /// Every message in the stream, in stream order.
    pub async fn stored(&self) -> Vec<Stored> {
        self.read_stream(false).await
    }

    /// Every message in the stream with its headers only (payloads left on the server: for big
    /// events).
    pub async fn stored_headers(&self) -> Vec<Stored> {
        self.read_stream(true).await
    }

    async fn read_stream(&self, headers_only: bool) -> Vec<Stored> {
        read_stream_with(&self.js().await, STREAM, headers_only).await
    }
}

/// Creates the `OUTBOX` stream on `outbox.>` (file storage, 10 min duplicate window) unless it
/// exists.
/// The rows the cleanup tests start from: 2,500 outbox rows processed ten days ago (aggregate ids
/// `c1`...), 10 processed now (`n1`...) and 10 pending (`p1`...).
pub async fn seed_cleanup_rows(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, processed_at)
             SELECT 'order', 'c' || g, 'order.created', '{}', now() - interval '10 days' FROM generate_series(1, 2500) g;
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, processed_at)
             SELECT 'order', 'n' || g, 'order.created', '{}', now() FROM generate_series(1, 10) g;
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'p' || g, 'order.created', '{}' FROM generate_series(1, 10) g;",
        )
        .await
        .expect("seed cleanup rows");
}

pub async fn create_stream(js: &jetstream::Context) {
    js.get_or_create_stream(stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .expect("create stream");
}

/// Every message of `stream`, in stream order.
pub async fn read_stream(js: &jetstream::Context, stream: &str) -> Vec<Stored> {
    read_stream_with(js, stream, false).await
}

async fn read_stream_with(
    js: &jetstream::Context,
    stream: &str,
    headers_only: bool,
) -> Vec<Stored> {
    let mut s = js.get_stream(stream).await.expect("stream");
    let total = s.info().await.expect("stream info").state.messages as usize;
    let mut out = Vec::with_capacity(total);
    if total == 0 {
        return out;
    }
    let consumer = s
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            headers_only,
            ..Default::default()
        })
        .await
        .expect("ordered consumer");
    let mut messages = consumer.messages().await.expect("messages");
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < total {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, messages.next())
            .await
            .expect("reading the stream timed out")
            .expect("stream ended")
            .expect("message");
        out.push(Stored::from_message(&msg));
    }
    out
}

/// An `order.created` event of the aggregate `order`/`aggregate_id` with the payload `{"n": n}`.
pub fn numbered_event(
    aggregate_id: &str,
    n: impl Into<serde_json::Value>,
) -> outbox_relay::NewEvent {
    outbox_relay::NewEvent::new(
        "order",
        aggregate_id,
        "order.created",
        &serde_json::json!({ "n": n.into() }),
    )
    .expect("event")
}

/// Asserts that no event id appears twice in the stream and returns the ids in stream order.
pub fn assert_unique(stored: &[Stored]) -> Vec<Uuid> {
    let mut seen = std::collections::HashSet::new();
    let ids: Vec<Uuid> = stored.iter().map(Stored::event_id).collect();
    for (i, id) in ids.iter().enumerate() {
        assert!(
            seen.insert(*id),
            "event {id} stored twice (stream seq {})",
            stored[i].seq
        );
    }
    ids
}

pub struct RunningRelay {
    pub token: CancellationToken,
    pub handle: JoinHandle<outbox_relay::Result<()>>,
}

impl RunningRelay {
    /// Runs a relay with `config` on a task of its own; panics when the config is refused.
    pub async fn start(config: RelayConfig) -> RunningRelay {
        let relay = Relay::new(config).await.expect("relay starts");
        let token = CancellationToken::new();
        let handle = tokio::spawn(relay.run(token.clone()));
        RunningRelay { token, handle }
    }

    /// Graceful stop; the relay must exit cleanly within 10 s.
    pub async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.handle)
            .await
            .expect("relay stops within 10 s")
            .expect("relay task")
            .expect("relay exits cleanly");
    }
}

/// The relay as the CLI binary, for kill and signal tests.
pub type CliRelay = RelayProcess;

impl RelayProcess {
    /// `run --metrics-addr off --fallback-interval 60s` plus `extra`, against `env`.
    pub fn run(env: &Env, extra: &[&str]) -> RelayProcess {
        let mut args = vec!["--metrics-addr", "off"];
        args.extend_from_slice(extra);
        Self::run_serving(env, &args)
    }

    /// `run --fallback-interval 60s` plus `args` (which must set `--metrics-addr`), against `env`.
    pub fn run_serving(env: &Env, args: &[&str]) -> RelayProcess {
        let mut cmd = relay_command();
        cmd.args(["run", "--fallback-interval", "60s"])
            .args(args)
            .env("DATABASE_URL", &env.db)
            .env("NATS_URL", env.nats.url())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        Self::from_command(cmd)
    }

    /// [`RelayProcess::run`] with its log (`RUST_LOG=info`) in a file of its own, for
    /// [`RelayProcess::log_tail`]. `extra` may set `--metrics-addr` (else `off`) and
    /// `--fallback-interval` (else `60s`).
    pub fn run_logged(env: &Env, extra: &[&str]) -> RelayProcess {
        Self::run_logged_with(env, extra, |_| {})
    }

    /// [`RelayProcess::run_logged`] with the relay's wall clock moved by `offset` (`"+10m"`,
    /// `"-10m"`; see [`crate::faketime::move_clock`]); the database keeps the real time.
    pub fn run_logged_with_clock(env: &Env, offset: &str, extra: &[&str]) -> RelayProcess {
        Self::run_logged_with(env, extra, |cmd| crate::faketime::move_clock(cmd, offset))
    }

    fn run_logged_with(
        env: &Env,
        extra: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> RelayProcess {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log =
            std::env::temp_dir().join(format!("outbox-relay-test-{}-{n}.log", std::process::id()));
        let file = std::fs::File::create(&log).expect("relay log file");
        let mut cmd = relay_command();
        cmd.arg("run");
        if !extra.contains(&"--fallback-interval") {
            cmd.args(["--fallback-interval", "60s"]);
        }
        if !extra.contains(&"--metrics-addr") {
            cmd.args(["--metrics-addr", "off"]);
        }
        cmd.args(extra)
            .env("DATABASE_URL", &env.db)
            .env("NATS_URL", env.nats.url())
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_TEST_RELAY_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        adjust(&mut cmd);
        RelayProcess::spawn("outbox-relay", cmd, Some(log)).expect("spawn outbox-relay")
    }

    /// `cmd` (an outbox-relay command with its own arguments) in a child process.
    pub fn from_command(cmd: Command) -> RelayProcess {
        RelayProcess::spawn("outbox-relay", cmd, None).expect("spawn outbox-relay")
    }
}

/// One outbox row as written, for ledger checks.
#[derive(Debug, Clone)]
pub struct Written {
    pub id: Uuid,
    pub seq: i64,
    pub aggregate: String,
}

impl Env {
    /// Every row written (the ledger), in seq order: the table's rows, or `written_ledger` where
    /// [`Env::wal_config`] keeps it (published rows are deleted there).
    pub async fn written(&self) -> Vec<Written> {
        let client = self.client().await;
        let kept: bool = client
            .query_one("SELECT to_regclass('written_ledger') IS NOT NULL", &[])
            .await
            .expect("ledger table")
            .get(0);
        let table = if kept {
            "written_ledger"
        } else {
            "outbox_events"
        };
        ledger(&client, table).await
    }
}

/// The guarantees, checked against the ledger: every written event is in the stream exactly once,
/// nothing else is, and within each aggregate the stream order is the `seq` order.
pub fn assert_ledger(written: &[Written], stored: &[Stored]) {
    let ids = assert_unique(stored);
    let by_id: HashMap<Uuid, &Written> = written.iter().map(|w| (w.id, w)).collect();
    for id in &ids {
        assert!(
            by_id.contains_key(id),
            "stream holds {id}, which was never written"
        );
    }
    assert_eq!(
        ids.len(),
        written.len(),
        "{} events written, {} in the stream",
        written.len(),
        ids.len()
    );
    let mut last_seq: HashMap<&str, i64> = HashMap::new();
    for (m, id) in stored.iter().zip(&ids) {
        let w = by_id[id];
        let agg =
            m.headers["Outbox-Aggregate-Type"].clone() + "/" + &m.headers["Outbox-Aggregate-Id"];
        assert_eq!(agg, w.aggregate, "aggregate headers of {id}");
        if let Some(prev) = last_seq.insert(w.aggregate.as_str(), w.seq) {
            assert!(
                prev < w.seq,
                "aggregate {} out of order: seq {} stored after seq {prev} (stream seq {})",
                w.aggregate,
                w.seq,
                m.seq
            );
        }
    }
}

impl Env {
    /// `aggregates` x `per_aggregate` events, one row per transaction, aggregates interleaved
    /// round-robin (seq order is the write order within each aggregate).
    pub async fn insert_interleaved(&self, aggregates: usize, per_aggregate: usize) {
        let client = self.client().await;
        client
            .execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', 'agg-' || a, 'order.step', jsonb_build_object('step', s, 'agg', a)
                 FROM generate_series(1, $2::int) s, generate_series(1, $1::int) a
                 ORDER BY s, a",
                &[&(aggregates as i32), &(per_aggregate as i32)],
            )
            .await
            .expect("insert interleaved");
    }
}

/// Runs an operator command of the CLI against `db` (bounded by the command itself): exit code,
/// stdout, stderr.
pub fn cli(db: &str, args: &[&str]) -> (Option<i32>, String, String) {
    cli_output(cli_command(db, args))
}

/// [`cli`] with the command's wall clock moved by `offset` (`"+1h"`, `"-10m"`; see
/// [`crate::faketime::move_clock`]); the database keeps the real time.
pub fn cli_with_clock(db: &str, offset: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = cli_command(db, args);
    crate::faketime::move_clock(&mut cmd, offset);
    cli_output(cmd)
}

fn cli_command(db: &str, args: &[&str]) -> Command {
    let mut cmd = relay_command();
    cmd.args(args)
        .env("DATABASE_URL", db)
        .env("RUST_LOG", "warn");
    cmd
}

fn cli_output(mut cmd: Command) -> (Option<i32>, String, String) {
    let out = cmd.output().expect("run outbox-relay");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every row of `table` (an outbox table, schema-qualified or not), in seq order.
pub async fn ledger(client: &tokio_postgres::Client, table: &str) -> Vec<Written> {
    client
        .query(
            &format!(
                "SELECT id, seq, aggregate_type || '/' || aggregate_id FROM {table} ORDER BY seq"
            ),
            &[],
        )
        .await
        .expect("ledger")
        .iter()
        .map(|r| Written {
            id: r.get(0),
            seq: r.get(1),
            aggregate: r.get(2),
        })
        .collect()
}
