//! End-to-end benchmarks of the relay: a throwaway PostgreSQL (fsync on) and nats-server, the relay
//! as the CLI binary in child processes.
//!
//! `cargo bench --bench relay` (full, about 10 minutes) or `OUTBOX_BENCH_QUICK=1 cargo bench --bench
//! relay` (under a minute). Positional arguments select scenarios by name substring, for example
//! `cargo bench --bench relay -- drain`.
//!
//! Scenarios:
//! 1. `drain`: a pre-inserted backlog drained by one relay (batch sizes, ordering, and once without
//!    ANALYZE after the insert) and by the classic loop (claim 100, publish and await each ack,
//!    UPDATE each row) implemented here.
//! 2. `idle-latency`: one event every 20 ms; COMMIT returned -> core NATS receipt (and, in the
//!    notes, from COMMIT sent), per notify mode.
//! 3. `writers`: writer throughput (pgbench) without a trigger, with the classic per-row NOTIFY
//!    trigger and with the migration's gated trigger, relay running; in full mode also two
//!    diagnostic variants (a relay polling every 10 ms without trigger, and a relay committing with
//!    synchronous_commit=off) that separate the cost of notifications from the relay's own work.
//!    A LISTEN connection of the bench counts how many writer transactions notified.
//! 4. `sustained`: 4 writers at full speed with the relay running; commit -> receipt latency and
//!    the pending backlog over time.
//! 5. `relays`: a backlog drained by 1 relay and by 3 relays at once; duplicates seen on the wire.
//!
//! Every row goes into one markdown table on stdout and into `target/bench/results.json`. A
//! scenario that fails is reported in the table and the others still run.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use serde::Serialize;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use common::outbox::STREAM;
use common::{pg_client, NatsServer, PgCluster, PgOptions};

type Res<T> = Result<T, String>;

/// Adds what was being done to an error.
trait Context<T> {
    fn ctx(self, what: &str) -> Res<T>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Res<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = Res<T>>) -> Res<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| format!("{what}: timed out after {limit:?}"))?
}

const SUBJECTS: &str = "outbox.>";
const SETUP_SQL: &str = include_str!("setup.sql");
const CLASSIC_TRIGGER_SQL: &str = include_str!("classic_trigger.sql");
const WRITER_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/writer.sql");
const RELAY_BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// The relay binary: this build's, or `OUTBOX_BENCH_RELAY_BIN` (another build to compare with, in
/// the same run on the same machine).
fn relay_bin() -> String {
    std::env::var("OUTBOX_BENCH_RELAY_BIN").unwrap_or_else(|_| RELAY_BIN.to_string())
}

/// Advisory key an idle relay holds while it waits for notifications (see the migration's
/// `outbox_events_notify`), as pg_locks shows it: classid = high 32 bits, objid = low 32 bits.
const ARMED_SQL: &str = "SELECT EXISTS (SELECT 1 FROM pg_locks \
     WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted \
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
       AND classid = 1 AND objid = 2955042706 AND objsubid = 1)";

const PENDING_SQL: &str = "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL";

/// What the drain polls every 50 ms: the same question as `PENDING_SQL = 0`, answered from the
/// first live entry of the pending index instead of counting them all (a count of a 100k backlog
/// every 50 ms costs the 2-core machine a good part of a core, and slows the relay it measures).
const ANY_PENDING_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM outbox_events WHERE processed_at IS NULL)";

/// The backlog: ~10 events per aggregate, aggregates interleaved (row g belongs to aggregate
/// g % $3), so consecutive rows are different aggregates and each aggregate's events are spread
/// over the whole table. The payload renders as ~150 bytes of JSON.
const BACKLOG_SQL: &str = "\
INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'order-' || (g % $3::int), 'order.updated',
       jsonb_build_object('order_id', g % $3::int, 'step', g / $3::int,
                          'customer_id', 'cust-' || lpad((g % 5000)::text, 5, '0'),
                          'amount_cents', (g * 7919) % 100000, 'currency', 'EUR',
                          'status', 'confirmed', 'note', 'leave at the door')
FROM generate_series($1::int, $2::int) AS g";

/// One writer transaction in a single statement (autocommit): a business row and its outbox row.
/// `ts_us` is the wall clock at the outbox insert, right before the implicit commit.
const WRITER_SQL: &str = "\
WITH o AS (
    INSERT INTO bench_orders (customer_id, amount_cents, status) VALUES ($1, $2, 'new')
    RETURNING id, customer_id, amount_cents)
INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', o.id::text, 'order.created',
       jsonb_build_object('order_id', o.id, 'customer_id', o.customer_id,
                          'amount_cents', o.amount_cents, 'currency', 'EUR', 'status', 'new',
                          'ts_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
FROM o";

// ---------------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Default, Serialize)]
struct Row {
    scenario: String,
    variant: String,
    events: Option<u64>,
    seconds: Option<f64>,
    events_per_s: Option<f64>,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
    writer_tps: Option<f64>,
    peak_rss_mb: Option<f64>,
    duplicates: Option<u64>,
    notes: String,
}

impl Row {
    fn new(scenario: &str, variant: &str) -> Row {
        Row {
            scenario: scenario.into(),
            variant: variant.into(),
            ..Default::default()
        }
    }

    fn failed(scenario: &str, variant: &str, error: &str) -> Row {
        Row {
            notes: format!("FAILED: {error}"),
            ..Row::new(scenario, variant)
        }
    }

    fn is_failure(&self) -> bool {
        self.notes.starts_with("FAILED")
    }

    fn note(&mut self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if text.is_empty() {
            return;
        }
        if !self.notes.is_empty() {
            self.notes.push_str("; ");
        }
        self.notes.push_str(text);
    }
}

/// Latency summary in milliseconds (nearest-rank percentiles).
struct Percentiles {
    p50: f64,
    p99: f64,
    max: f64,
}

fn percentiles(values: &mut [f64]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let i = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
        values[i - 1]
    };
    Some(Percentiles {
        p50: rank(0.50),
        p99: rank(0.99),
        max: values[values.len() - 1],
    })
}

fn set_latency(row: &mut Row, values: &mut [f64]) {
    if let Some(p) = percentiles(values) {
        row.p50_ms = Some(p.p50);
        row.p99_ms = Some(p.p99);
        row.max_ms = Some(p.max);
    }
}

fn markdown_table(rows: &[Row]) -> String {
    fn num(v: Option<f64>, decimals: usize) -> String {
        v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
    }
    fn int(v: Option<u64>) -> String {
        v.map_or_else(|| "-".into(), |v| v.to_string())
    }
    let mut out = String::from(
        "| scenario | variant | events | seconds | events/s | p50 ms | p99 ms | max ms | writer tps | peak RSS MB | duplicates | notes |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario,
            r.variant,
            int(r.events),
            num(r.seconds, 2),
            num(r.events_per_s, 0),
            num(r.p50_ms, 2),
            num(r.p99_ms, 2),
            num(r.max_ms, 2),
            num(r.writer_tps, 0),
            num(r.peak_rss_mb, 1),
            int(r.duplicates),
            r.notes.replace('|', "/").replace('\n', " "),
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------------------------

struct Ctx {
    pg: PgCluster,
    nats_url: String,
    quick: bool,
    pgbench: Option<PathBuf>,
    log_dir: PathBuf,
}

impl Ctx {
    fn backlog(&self) -> u64 {
        if self.quick {
            10_000
        } else {
            100_000
        }
    }

    /// Bound on one drain: generous, but a stuck relay cannot hold the bench forever.
    fn drain_timeout(&self, events: u64, classic: bool) -> Duration {
        let per_s = if classic { 400 } else { 1_500 };
        Duration::from_secs((events / per_s).max(30) + 30)
    }
}

/// A fresh migrated database (its own `outbox_events`) and an empty `OUTBOX` stream.
struct Db {
    url: String,
    client: Client,
}

async fn fresh_db(ctx: &Ctx) -> Res<Db> {
    let url = ctx.pg.create_database().await;
    let mut client = pg_client(&url).await;
    within(Duration::from_secs(60), "migrate", async {
        outbox_relay::migrate::migrate(&mut client)
            .await
            .ctx("migrate")
    })
    .await?;
    reset_stream(&ctx.nats_url).await?;
    Ok(Db { url, client })
}

/// Drops a database of an earlier variant (best effort: it only keeps the cluster small). Not in
/// quick mode, where the few small databases go with the cluster (a drop costs a checkpoint).
async fn drop_db(ctx: &Ctx, url: &str) {
    if ctx.quick {
        return;
    }
    let Some(name) = url.rsplit('/').next() else {
        return;
    };
    let admin = pg_client(&ctx.pg.url("postgres")).await;
    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    if let Err(e) = within(Duration::from_secs(60), "drop database", async {
        admin.batch_execute(&sql).await.ctx(&sql)
    })
    .await
    {
        eprintln!("[bench] warning: {e}");
    }
}

/// A core NATS subscription on every outbox subject, flushed so that it is in place before the
/// first publish. Keep the client alive as long as the subscription.
async fn subscribe_all(url: &str) -> Res<(async_nats::Client, async_nats::Subscriber)> {
    let nc = nats_client(url).await?;
    let sub = nc.subscribe(SUBJECTS).await.ctx("subscribe")?;
    within(Duration::from_secs(10), "flush", async {
        nc.flush().await.ctx("flush")
    })
    .await?;
    Ok((nc, sub))
}

async fn nats_client(url: &str) -> Res<async_nats::Client> {
    within(Duration::from_secs(10), "connect to NATS", async {
        async_nats::ConnectOptions::new()
            // Large enough that a subscriber counting a whole backlog never drops a message.
            .subscription_capacity(1 << 20)
            .connect(url)
            .await
            .ctx("connect to NATS")
    })
    .await
}

/// Deletes and recreates `OUTBOX` (file storage, `outbox.>`, 10 minute duplicate window).
async fn reset_stream(nats_url: &str) -> Res<()> {
    let js = jetstream::new(nats_client(nats_url).await?);
    within(Duration::from_secs(60), "reset stream", async {
        // A missing stream is fine; any other trouble shows in the create below.
        let _ = js.delete_stream(STREAM).await;
        js.create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec![SUBJECTS.into()],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .ctx("create stream")?;
        Ok(())
    })
    .await
}

async fn stream_len(nats_url: &str) -> Res<u64> {
    let js = jetstream::new(nats_client(nats_url).await?);
    within(Duration::from_secs(10), "stream info", async {
        let mut s = js.get_stream(STREAM).await.ctx("get stream")?;
        Ok(s.info().await.ctx("stream info")?.state.messages)
    })
    .await
}

async fn query_i64(client: &Client, sql: &str) -> Res<i64> {
    within(Duration::from_secs(30), sql, async {
        Ok(client.query_one(sql, &[]).await.ctx(sql)?.get::<_, i64>(0))
    })
    .await
}

async fn pending(client: &Client) -> Res<i64> {
    query_i64(client, PENDING_SQL).await
}

/// A CHECKPOINT so that a measurement does not pay for the previous setup's dirty pages (full
/// mode only: it costs about a second on this disk).
async fn checkpoint(ctx: &Ctx, client: &Client) -> Res<()> {
    if ctx.quick {
        return Ok(());
    }
    exec(client, "CHECKPOINT", Duration::from_secs(120)).await
}

async fn exec(client: &Client, sql: &str, limit: Duration) -> Res<()> {
    within(limit, sql, async {
        client.batch_execute(sql).await.ctx(sql)
    })
    .await
}

/// Inserts `events` backlog rows in chunks of 10,000 (one transaction each), then (with `analyze`)
/// VACUUM ANALYZE, as autovacuum would have done by the time a long outage ends, and a CHECKPOINT
/// so that every variant starts from the same state. Returns the average payload size in bytes.
/// The backlog a drain starts from.
#[derive(Debug, Clone, Copy)]
struct Backlog {
    events: u64,
    /// Events per aggregate, interleaved across aggregates in seq order.
    per_aggregate: u64,
    /// VACUUM ANALYZE after the insert (else the planner has no statistics of the burst).
    analyze: bool,
}

impl Backlog {
    fn new(events: u64) -> Backlog {
        Backlog {
            events,
            per_aggregate: 10,
            analyze: true,
        }
    }

    fn describe(&self) -> String {
        format!(
            "backlog: {} events, {} per aggregate, interleaved{}",
            self.events,
            self.per_aggregate,
            if self.analyze {
                ", VACUUM ANALYZE before the drain"
            } else {
                ""
            }
        )
    }
}

async fn insert_backlog(ctx: &Ctx, client: &Client, backlog: Backlog) -> Res<f64> {
    let Backlog {
        events, analyze, ..
    } = backlog;
    let aggregates = (events / backlog.per_aggregate.max(1)).max(1) as i32;
    let mut start = 0u64;
    while start < events {
        let end = (start + 10_000).min(events);
        let (from, to) = (start as i32, end as i32 - 1);
        within(Duration::from_secs(120), "insert backlog", async {
            client
                .execute(BACKLOG_SQL, &[&from, &to, &aggregates])
                .await
                .ctx("insert backlog")
        })
        .await?;
        start = end;
    }
    if analyze {
        exec(
            client,
            "VACUUM ANALYZE outbox_events",
            Duration::from_secs(120),
        )
        .await?;
    }
    checkpoint(ctx, client).await?;
    within(Duration::from_secs(30), "payload size", async {
        let row = client
            .query_one(
                "SELECT avg(octet_length(payload::text))::float8 FROM outbox_events",
                &[],
            )
            .await
            .ctx("payload size")?;
        Ok(row.get::<_, Option<f64>>(0).unwrap_or(0.0))
    })
    .await
}

/// (events processed, seconds between the first and the last `processed_at`).
async fn processed_span(client: &Client) -> Res<(i64, f64)> {
    within(Duration::from_secs(30), "processed span", async {
        let row = client
            .query_one(
                "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM max(processed_at) - min(processed_at)), 0)::float8
                 FROM outbox_events WHERE processed_at IS NOT NULL",
                &[],
            )
            .await
            .ctx("processed span")?;
        Ok((row.get(0), row.get(1)))
    })
    .await
}

/// Waits until an idle relay holds the arming key (it listens and writers notify it).
async fn wait_armed(client: &Client, relays: &mut [RelayProc], limit: Duration) -> Res<bool> {
    let deadline = Instant::now() + limit;
    loop {
        let armed: bool = within(Duration::from_secs(10), "armed check", async {
            Ok(client
                .query_one(ARMED_SQL, &[])
                .await
                .ctx("armed check")?
                .get(0))
        })
        .await?;
        if armed {
            return Ok(true);
        }
        for r in relays.iter_mut() {
            r.check_alive()?;
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `pgbench` next to the `postgres` the harness runs, else anywhere we can find one.
fn find_pgbench() -> Option<PathBuf> {
    fn executable(p: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    fn on_path(name: &str) -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| executable(p))
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("OUTBOX_RELAY_TEST_PG_BINDIR") {
        dirs.push(dir.into());
    }
    if let Some(postgres) = on_path("postgres") {
        if let Some(dir) = std::fs::canonicalize(&postgres)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            dirs.push(dir);
        }
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            dirs.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
    }
    let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .collect();
    versioned.sort();
    dirs.extend(versioned.into_iter().rev().map(|(_, d)| d));
    dirs.into_iter()
        .map(|d| d.join("pgbench"))
        .find(|p| executable(p))
        .or_else(|| on_path("pgbench"))
}

// ---------------------------------------------------------------------------------------------
// The relay as a child process
// ---------------------------------------------------------------------------------------------

/// `outbox-relay run` in a child process; killed on drop, and by the kernel if the bench dies.
struct RelayProc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl RelayProc {
    fn spawn(ctx: &Ctx, name: &str, db_url: &str, extra: &[String]) -> Res<RelayProc> {
        let log = ctx.log_dir.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log).ctx(&format!("create {}", log.display()))?;
        let bin = relay_bin();
        let mut cmd = Command::new(&bin);
        cmd.arg("run")
            .args(["--database-url", db_url])
            .args(["--nats-url", &ctx.nats_url])
            .args(["--metrics-addr", "off"])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_BENCH_RELAY_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        // SAFETY: only an async-signal-safe system call (prctl) runs between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                Ok(())
            });
        }
        let child = cmd.spawn().ctx(&format!("spawn {bin}"))?;
        Ok(RelayProc {
            name: name.into(),
            child,
            log,
        })
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join(" / ")
    }

    /// An error when the relay has exited (it must run until we stop it).
    fn check_alive(&mut self) -> Res<()> {
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
    fn peak_rss_mb(&self) -> Option<f64> {
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

    /// SIGTERM and wait (15 s, then SIGKILL). Returns a note when the exit was not clean.
    async fn stop(mut self) -> Option<String> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return None,
                Ok(Some(status)) => {
                    return Some(format!(
                        "relay {} exited with {status}: {}",
                        self.name,
                        self.log_tail()
                    ))
                }
                Ok(None) if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Some(format!(
                        "relay {} ignored SIGTERM for 15 s (killed)",
                        self.name
                    ));
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => return Some(format!("waitpid of relay {}: {e}", self.name)),
            }
        }
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn max_rss(relays: &[RelayProc]) -> Option<f64> {
    relays
        .iter()
        .filter_map(RelayProc::peak_rss_mb)
        .reduce(f64::max)
}

async fn stop_all(relays: Vec<RelayProc>, row: &mut Row) {
    for r in relays {
        if let Some(note) = r.stop().await {
            row.note(note);
        }
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------------------------
// Running variants in isolation
// ---------------------------------------------------------------------------------------------

/// Runs one variant on a task of its own, bounded: an error, a panic or a timeout becomes a
/// FAILED row (the task is aborted, which kills its relays), never the end of the bench.
async fn isolated<F>(scenario: &'static str, variant: String, limit: Duration, fut: F) -> Row
where
    F: Future<Output = Res<Row>> + Send + 'static,
{
    let variant = variant.as_str();
    eprintln!("[bench] {scenario} / {variant} ...");
    let started = Instant::now();
    let mut handle = tokio::spawn(fut);
    let row = match tokio::time::timeout(limit, &mut handle).await {
        Ok(Ok(Ok(row))) => row,
        Ok(Ok(Err(e))) => Row::failed(scenario, variant, &e),
        Ok(Err(e)) if e.is_panic() => {
            let payload = e.into_panic();
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "(non-string panic)".into());
            Row::failed(scenario, variant, &format!("panicked: {msg}"))
        }
        Ok(Err(e)) => Row::failed(scenario, variant, &format!("task failed: {e}")),
        Err(_) => {
            handle.abort();
            let _ = handle.await;
            Row::failed(scenario, variant, &format!("timed out after {limit:?}"))
        }
    };
    eprintln!(
        "[bench] {scenario} / {variant}: {:.1}s{}",
        started.elapsed().as_secs_f64(),
        if row.is_failure() {
            format!(" {}", row.notes)
        } else {
            String::new()
        }
    );
    row
}

// ---------------------------------------------------------------------------------------------
// Duplicate counting on the wire
// ---------------------------------------------------------------------------------------------

/// A core NATS subscription on `outbox.>` counting every publish per `Outbox-Event-Id`.
struct DupCounter {
    received: Arc<AtomicU64>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<(HashMap<u128, u32>, u64)>,
}

struct DupCount {
    received: u64,
    distinct: u64,
    duplicates: u64,
    without_id: u64,
}

impl DupCounter {
    async fn start(nats_url: &str, expected: u64) -> Res<DupCounter> {
        let client = nats_client(nats_url).await?;
        let mut sub = client.subscribe(SUBJECTS).await.ctx("subscribe")?;
        within(Duration::from_secs(10), "flush", async {
            client.flush().await.ctx("flush")
        })
        .await?;
        let received = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let task = {
            let received = received.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let _client = client;
                let mut seen: HashMap<u128, u32> = HashMap::with_capacity(expected as usize);
                let mut without_id = 0u64;
                loop {
                    let msg = tokio::select! {
                        _ = stop.cancelled() => break,
                        m = sub.next() => match m {
                            Some(m) => m,
                            None => break,
                        },
                    };
                    let id = msg
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("Outbox-Event-Id"))
                        .and_then(|v| uuid::Uuid::parse_str(v.as_str()).ok());
                    match id {
                        Some(id) => *seen.entry(id.as_u128()).or_insert(0) += 1,
                        None => without_id += 1,
                    }
                    received.fetch_add(1, AtomicOrdering::Relaxed);
                }
                (seen, without_id)
            })
        };
        Ok(DupCounter {
            received,
            stop,
            task,
        })
    }

    /// Waits (bounded) until `expected` messages arrived, then counts.
    async fn finish(self, expected: u64) -> Res<DupCount> {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.received.load(AtomicOrdering::Relaxed) < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Late redeliveries, if any, arrive right behind.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.stop.cancel();
        let (seen, without_id) = within(Duration::from_secs(10), "duplicate counter", async {
            self.task.await.ctx("duplicate counter task")
        })
        .await?;
        let received: u64 = seen.values().map(|&n| u64::from(n)).sum();
        Ok(DupCount {
            received,
            distinct: seen.len() as u64,
            duplicates: seen.values().map(|&n| u64::from(n.saturating_sub(1))).sum(),
            without_id,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Backlog drains (scenarios 1 and 5)
// ---------------------------------------------------------------------------------------------

enum Drainer {
    /// `count` relay processes at once with these extra flags.
    Relays { count: usize, args: Vec<String> },
    /// The classic loop implemented below, in this process.
    Classic,
}

async fn drain_variant(
    ctx: Arc<Ctx>,
    scenario: &'static str,
    variant: String,
    backlog: Backlog,
    drainer: Drainer,
    count_dups: bool,
) -> Res<Row> {
    let events = backlog.events;
    let mut row = Row::new(scenario, &variant);
    let db = fresh_db(&ctx).await?;
    let payload_bytes = insert_backlog(&ctx, &db.client, backlog).await?;
    let dups = if count_dups {
        Some(DupCounter::start(&ctx.nats_url, events).await?)
    } else {
        None
    };

    let started = Instant::now();
    let mut relays = Vec::new();
    let mut classic = None;
    match &drainer {
        Drainer::Relays { count, args } => {
            for i in 0..*count {
                let name = format!("{scenario}-{}-{i}", slug(&variant));
                relays.push(RelayProc::spawn(&ctx, &name, &db.url, args)?);
            }
        }
        Drainer::Classic => {
            classic = Some(tokio::spawn(classic_loop(
                db.url.clone(),
                ctx.nats_url.clone(),
            )));
        }
    }

    let limit = ctx.drain_timeout(events, classic.is_some());
    let deadline = started + limit;
    loop {
        let any: bool = within(Duration::from_secs(30), ANY_PENDING_SQL, async {
            Ok(db
                .client
                .query_one(ANY_PENDING_SQL, &[])
                .await
                .ctx(ANY_PENDING_SQL)?
                .get(0))
        })
        .await?;
        if !any && pending(&db.client).await? == 0 {
            break;
        }
        for r in relays.iter_mut() {
            r.check_alive()?;
        }
        if let Some(h) = &classic {
            if h.is_finished() {
                let result = classic.take().expect("classic handle was just checked");
                result.await.ctx("classic loop task")??;
                let left = pending(&db.client).await?;
                return Err(format!(
                    "the classic loop stopped with {left} events pending"
                ));
            }
        }
        if Instant::now() >= deadline {
            let left = pending(&db.client).await?;
            return Err(format!("{left} events still pending after {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wall = started.elapsed().as_secs_f64();
    row.peak_rss_mb = max_rss(&relays);
    stop_all(relays, &mut row).await;
    if let Some(h) = classic {
        within(Duration::from_secs(30), "classic loop end", async {
            h.await.ctx("classic loop task")?
        })
        .await?;
    }

    let (processed, span) = processed_span(&db.client).await?;
    row.events = Some(processed as u64);
    row.seconds = Some(span);
    if span > 0.0 {
        row.events_per_s = Some(processed as f64 / span);
    }
    row.note(format!("wall incl. startup {wall:.2}s"));
    let stored = stream_len(&ctx.nats_url).await?;
    if stored != events {
        row.note(format!("STREAM HOLDS {stored} OF {events}"));
    }
    if let Some(counter) = dups {
        let c = counter.finish(events).await?;
        row.duplicates = Some(c.duplicates);
        row.note(format!(
            "wire: {} msgs, {} distinct ids",
            c.received, c.distinct
        ));
        if c.distinct < events {
            row.note(format!(
                "{} events never seen on the wire",
                events - c.distinct
            ));
        }
        if c.without_id > 0 {
            row.note(format!("{} msgs without Outbox-Event-Id", c.without_id));
        }
    }
    row.note(format!("payload ~{payload_bytes:.0} B"));
    row.note(backlog.describe());
    drop(db.client);
    drop_db(&ctx, &db.url).await;
    Ok(row)
}

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The classic relay loop, for reference: one connection; per transaction claim 100 rows
/// `FOR UPDATE SKIP LOCKED`, publish each and await its ack, `UPDATE` each; commit; repeat until a
/// claim comes back empty. Returns the number of rows published.
async fn classic_loop(db_url: String, nats_url: String) -> Res<u64> {
    let mut client = pg_client(&db_url).await;
    let js = jetstream::new(nats_client(&nats_url).await?);
    let claim = client
        .prepare(
            "SELECT id, event_type, payload::text FROM outbox_events
             WHERE processed_at IS NULL ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED",
        )
        .await
        .ctx("prepare claim")?;
    let mark = client
        .prepare("UPDATE outbox_events SET processed_at = now() WHERE id = $1")
        .await
        .ctx("prepare update")?;
    let mut published = 0u64;
    loop {
        let tx = client.transaction().await.ctx("begin")?;
        let rows = tx.query(&claim, &[]).await.ctx("claim")?;
        if rows.is_empty() {
            tx.commit().await.ctx("commit")?;
            return Ok(published);
        }
        for row in &rows {
            let id: uuid::Uuid = row.get(0);
            let event_type: String = row.get(1);
            let payload: String = row.get(2);
            let id_text = id.to_string();
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id_text.as_str());
            headers.insert("Outbox-Event-Id", id_text.as_str());
            let ack = js
                .publish_with_headers(format!("outbox.{event_type}"), headers, payload.into())
                .await
                .ctx("publish")?;
            within(Duration::from_secs(10), "publish ack", async {
                ack.await.ctx("publish ack")
            })
            .await?;
            tx.execute(&mark, &[&id]).await.ctx("update")?;
            published += 1;
        }
        tx.commit().await.ctx("commit")?;
    }
}

async fn scenario_drain(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "1 backlog drain";
    let events = ctx.backlog();
    let run_with = |ctx: &Arc<Ctx>, variant: String, drainer: Drainer, backlog: Backlog| {
        let limit = ctx.drain_timeout(events, matches!(drainer, Drainer::Classic))
            + Duration::from_secs(120);
        let fut = drain_variant(ctx.clone(), S, variant.clone(), backlog, drainer, false);
        isolated(S, variant, limit, fut)
    };
    let run = |ctx: &Arc<Ctx>, variant: String, drainer: Drainer| {
        run_with(ctx, variant, drainer, Backlog::new(events))
    };
    let relay = |batch: usize, ordering: &str| Drainer::Relays {
        count: 1,
        args: args(&["--batch-size", &batch.to_string(), "--ordering", ordering]),
    };
    let mut rows = Vec::new();
    let default_row = run(
        &ctx,
        "batch 1000 (default), ordering aggregate".into(),
        relay(1000, "aggregate"),
    )
    .await;
    let mut best: Option<(usize, f64)> = default_row.events_per_s.map(|r| (1000, r));
    rows.push(default_row);
    let tuned: &[usize] = if ctx.quick { &[2000] } else { &[200, 2000] };
    for &batch in tuned {
        let row = run(
            &ctx,
            format!("batch {batch}, ordering aggregate"),
            relay(batch, "aggregate"),
        )
        .await;
        if let Some(rate) = row.events_per_s {
            if best.is_none_or(|(_, r)| rate > r) {
                best = Some((batch, rate));
            }
        }
        rows.push(row);
    }
    let best_batch = best.map_or(1000, |(b, _)| b);
    rows.push(
        run(
            &ctx,
            format!("batch {best_batch}, ordering none"),
            relay(best_batch, "none"),
        )
        .await,
    );
    if !ctx.quick && best_batch != 1000 {
        rows.push(
            run(
                &ctx,
                "batch 1000 (default), ordering none".into(),
                relay(1000, "none"),
            )
            .await,
        );
    }
    let mut stale = run_with(
        &ctx,
        "batch 1000, ordering aggregate, backlog NOT analyzed".into(),
        relay(1000, "aggregate"),
        Backlog {
            analyze: false,
            ..Backlog::new(events)
        },
    )
    .await;
    stale.note("no VACUUM ANALYZE after the insert (a fresh burst)");
    rows.push(stale);
    let mut deep = run_with(
        &ctx,
        "batch 1000, ordering aggregate, 100 deep aggregates".into(),
        relay(1000, "aggregate"),
        Backlog {
            per_aggregate: events / 100,
            ..Backlog::new(events)
        },
    )
    .await;
    deep.note("few aggregates with deep backlogs: heads are found by hopping between aggregates");
    rows.push(deep);
    let mut classic = run(
        &ctx,
        "classic loop (100/tx, ack + UPDATE per row)".into(),
        Drainer::Classic,
    )
    .await;
    classic.note("reference implemented in the bench (in-process, no RSS)");
    let classic_rate = classic.events_per_s;
    rows.push(classic);
    for row in rows.iter_mut() {
        if let (Some(ours), Some(base)) = (row.events_per_s, classic_rate) {
            if !row.variant.starts_with("classic") && base > 0.0 {
                row.note(format!("{:.1}x classic", ours / base));
            }
        }
    }
    rows
}

async fn scenario_relays(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "5 one vs three relays";
    let events = ctx.backlog();
    let mut rows = Vec::new();
    for count in [1usize, 3] {
        let variant = format!(
            "{count} relay{}, batch 1000",
            if count > 1 { "s" } else { "" }
        );
        let drainer = Drainer::Relays {
            count,
            args: args(&["--batch-size", "1000"]),
        };
        let limit = ctx.drain_timeout(events, false) + Duration::from_secs(120);
        let fut = drain_variant(
            ctx.clone(),
            S,
            variant.clone(),
            Backlog::new(events),
            drainer,
            true,
        );
        let mut row = isolated(S, variant, limit, fut).await;
        if count > 1 && !row.is_failure() {
            row.note("peak RSS is the largest of the processes");
        }
        rows.push(row);
    }
    if let (Some(one), Some(three)) = (rows[0].events_per_s, rows[1].events_per_s) {
        rows[1].note(format!("{:.2}x one relay", three / one));
    }
    rows
}

// ---------------------------------------------------------------------------------------------
// Scenario 2: idle latency
// ---------------------------------------------------------------------------------------------

async fn idle_latency(ctx: Arc<Ctx>, variant: String, extra: Vec<String>, n: usize) -> Res<Row> {
    const S: &str = "2 idle latency";
    let mut row = Row::new(S, &variant);
    let Db {
        url,
        client: mut writer,
    } = fresh_db(&ctx).await?;
    let poll_mode = extra.iter().any(|a| a == "poll");

    // Receipt instants by event number (k in the payload); -1 is the warm-up event.
    let received: Arc<Mutex<HashMap<i64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let (_nc, mut sub) = subscribe_all(&ctx.nats_url).await?;
    let receiver = {
        let received = received.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let at = Instant::now();
                let k = serde_json::from_slice::<serde_json::Value>(&msg.payload)
                    .ok()
                    .and_then(|v| v.get("k").and_then(serde_json::Value::as_i64));
                if let Some(k) = k {
                    received.lock().expect("receipt map lock").insert(k, at);
                }
            }
        })
    };
    let _abort_receiver = AbortOnDrop(receiver);

    let notifies = NotifyCounter::start(&url).await?;
    let mut relays = vec![RelayProc::spawn(
        &ctx,
        &format!("idle-{}", slug(&variant)),
        &url,
        &extra,
    )?];
    if !poll_mode && !wait_armed(&writer, &mut relays, Duration::from_secs(15)).await? {
        row.note("relay not seen armed within 15 s");
    }

    let insert = writer
        .prepare(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'order-' || $1::int, 'order.updated',
                     jsonb_build_object('k', $1::int, 'customer_id', 'cust-00042', 'amount_cents', 4200,
                                        'currency', 'EUR', 'status', 'confirmed',
                                        'note', 'standard shipping, leave at the door'))",
        )
        .await
        .ctx("prepare insert")?;
    let has = |k: i64| received.lock().expect("receipt map lock").contains_key(&k);

    // Warm-up: one event end to end, then let the relay settle (re-arm) before measuring.
    writer
        .execute(&insert, &[&-1i32])
        .await
        .ctx("warm-up insert")?;
    let warm_deadline = Instant::now() + Duration::from_secs(15);
    while !has(-1) {
        relays[0].check_alive()?;
        if Instant::now() >= warm_deadline {
            return Err("the warm-up event was not received within 15 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut ticker = tokio::time::interval(Duration::from_millis(20));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // COMMIT sent, and COMMIT returned (the event is durable and visible from then on).
    let mut sent: Vec<Instant> = Vec::with_capacity(n);
    let mut returned: Vec<Instant> = Vec::with_capacity(n);
    let mut commit_ms: Vec<f64> = Vec::with_capacity(n);
    let notified_before = notifies.settled().await;
    let started = Instant::now();
    for k in 0..n as i32 {
        ticker.tick().await;
        let tx = writer.transaction().await.ctx("begin")?;
        tx.execute(&insert, &[&k]).await.ctx("insert")?;
        let before_commit = Instant::now();
        tx.commit().await.ctx("commit")?;
        let committed = Instant::now();
        commit_ms.push((committed - before_commit).as_secs_f64() * 1000.0);
        sent.push(before_commit);
        returned.push(committed);
    }
    row.seconds = Some(started.elapsed().as_secs_f64());

    let wait = if poll_mode { 5 } else { 10 };
    let deadline = Instant::now() + Duration::from_secs(wait);
    while (0..n as i64).any(|k| !has(k)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    row.peak_rss_mb = max_rss(&relays);
    stop_all(relays, &mut row).await;

    let mut lat: Vec<f64> = Vec::with_capacity(n);
    let mut lat_sent: Vec<f64> = Vec::with_capacity(n);
    let mut slow: Vec<String> = Vec::new();
    {
        let received = received.lock().expect("receipt map lock");
        for (k, (t0, t1)) in sent.iter().zip(&returned).enumerate() {
            if let Some(at) = received.get(&(k as i64)) {
                let ms = at.saturating_duration_since(*t1).as_secs_f64() * 1000.0;
                let ms_sent = at.saturating_duration_since(*t0).as_secs_f64() * 1000.0;
                if ms_sent > 100.0 {
                    slow.push(format!(
                        "#{k} {ms_sent:.0} ms (commit {:.0} ms)",
                        commit_ms[k]
                    ));
                }
                lat.push(ms);
                lat_sent.push(ms_sent);
            }
        }
    }
    row.events = Some(lat.len() as u64);
    if lat.len() < n {
        row.note(format!("{} of {n} events NOT RECEIVED", n - lat.len()));
    }
    set_latency(&mut row, &mut lat);
    row.note(format!("{} of {n} took > 100 ms", slow.len()));
    if !slow.is_empty() && slow.len() <= 5 {
        row.note(format!("slow: {}", slow.join(", ")));
    }
    let notified = notifies.settled().await - notified_before;
    row.note(notify_share(notified, n as u64));
    if let Some(p) = percentiles(&mut commit_ms) {
        row.note(format!(
            "writer COMMIT itself: p50 {:.2} / p99 {:.2} / max {:.1} ms",
            p.p50, p.p99, p.max
        ));
    }
    if let Some(p) = percentiles(&mut lat_sent) {
        row.note(format!(
            "from COMMIT sent instead: p50 {:.2} / p99 {:.2} / max {:.1} ms",
            p.p50, p.p99, p.max
        ));
    }
    row.note("COMMIT returned -> core NATS receipt; one event every 20 ms");
    drop(writer);
    drop_db(&ctx, &url).await;
    Ok(row)
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection of the bench's own that LISTENs on `outbox_event` and counts what arrives: with the
/// migration's trigger (one notification per transaction at most, identical ones are folded) this
/// is the number of writer transactions that notified.
struct NotifyCounter {
    count: Arc<AtomicU64>,
    _client: Client,
    _task: AbortOnDrop<()>,
}

impl NotifyCounter {
    async fn start(url: &str) -> Res<NotifyCounter> {
        let (client, mut connection) = within(Duration::from_secs(10), "connect listener", async {
            tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .ctx("connect listener")
        })
        .await?;
        let count = Arc::new(AtomicU64::new(0));
        let task = {
            let count = count.clone();
            tokio::spawn(async move {
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(m) = messages.next().await {
                    match m {
                        Ok(tokio_postgres::AsyncMessage::Notification(_)) => {
                            count.fetch_add(1, AtomicOrdering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            })
        };
        exec(&client, "LISTEN outbox_event", Duration::from_secs(10)).await?;
        Ok(NotifyCounter {
            count,
            _client: client,
            _task: AbortOnDrop(task),
        })
    }

    /// Notifications received so far (after a short pause for the last deliveries).
    async fn settled(&self) -> u64 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.count.load(AtomicOrdering::Relaxed)
    }
}

fn notify_share(notified: u64, txns: u64) -> String {
    let pct = if txns > 0 {
        notified as f64 * 100.0 / txns as f64
    } else {
        0.0
    };
    format!("NOTIFY in {notified} of {txns} writer txns ({pct:.0}%)")
}

async fn scenario_idle_latency(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "2 idle latency";
    let n = if ctx.quick { 100 } else { 500 };
    let variants = [
        (
            "notify gated (default), fallback 60s",
            args(&["--notify-mode", "gated", "--fallback-interval", "60s"]),
        ),
        (
            "notify always, fallback 60s",
            args(&["--notify-mode", "always", "--fallback-interval", "60s"]),
        ),
        (
            "poll, fallback 1s",
            args(&["--notify-mode", "poll", "--fallback-interval", "1s"]),
        ),
    ];
    let mut rows = Vec::new();
    for (variant, extra) in variants {
        let limit = Duration::from_secs(n as u64 / 50 + 90);
        let fut = idle_latency(ctx.clone(), variant.into(), extra, n);
        rows.push(isolated(S, variant.into(), limit, fut).await);
    }
    rows
}

// ---------------------------------------------------------------------------------------------
// Scenario 3: writer throughput
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Trigger {
    None,
    ClassicPerRow,
    Ours,
}

/// One writer-throughput variant: the trigger on `outbox_events` and how the relay runs.
#[derive(Debug, Clone, Copy)]
struct WriterVariant {
    label: &'static str,
    trigger: Trigger,
    /// Extra relay flags (none: the CLI defaults).
    relay_args: &'static [&'static str],
    /// Appended to the relay's database URL.
    url_suffix: &'static str,
    /// Not one of the three compared variants: an extra data point to explain them.
    diagnostic: bool,
}

const WRITER_VARIANTS: [WriterVariant; 5] = [
    WriterVariant {
        label: "(a) no trigger",
        trigger: Trigger::None,
        relay_args: &[],
        url_suffix: "",
        diagnostic: false,
    },
    WriterVariant {
        label: "(b) classic per-row NOTIFY",
        trigger: Trigger::ClassicPerRow,
        relay_args: &[],
        url_suffix: "",
        diagnostic: false,
    },
    WriterVariant {
        label: "(c) ours (gated, per statement)",
        trigger: Trigger::Ours,
        relay_args: &[],
        url_suffix: "",
        diagnostic: false,
    },
    WriterVariant {
        label: "(d) no trigger, relay polling every 10 ms",
        trigger: Trigger::None,
        relay_args: &["--notify-mode", "poll", "--fallback-interval", "10ms"],
        url_suffix: "",
        diagnostic: true,
    },
    WriterVariant {
        label: "(e) ours, relay with synchronous_commit=off",
        trigger: Trigger::Ours,
        relay_args: &[],
        url_suffix: "?options=-c%20synchronous_commit%3Doff",
        diagnostic: true,
    },
];

/// Writer transactions from tokio-postgres clients at full speed for `duration`: (committed, s).
async fn run_writers(url: &str, clients: usize, duration: Duration) -> Res<(u64, f64)> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        let client = pg_client(url).await;
        let stmt = client.prepare(WRITER_SQL).await.ctx("prepare writer")?;
        conns.push((client, stmt));
    }
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, (client, stmt))| {
            tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(i as u64 + 1);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let customer = rng.i32(1..=5000);
                    let amount = rng.i64(100..=100_000);
                    within(Duration::from_secs(30), "writer transaction", async {
                        client
                            .execute(&stmt, &[&customer, &amount])
                            .await
                            .ctx("writer transaction")
                    })
                    .await?;
                    n += 1;
                }
                Ok::<u64, String>(n)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.ctx("writer task")??;
    }
    Ok((total, started.elapsed().as_secs_f64()))
}

/// `pgbench -n -f writer.sql -c N -j min(2,N) -T secs`: (transactions, tps).
async fn run_pgbench(pgbench: &Path, url: &str, clients: usize, secs: u64) -> Res<(u64, f64)> {
    let mut cmd = Command::new(pgbench);
    cmd.args(["-n", "-f", WRITER_SCRIPT])
        .args(["-c", &clients.to_string()])
        .args(["-j", &clients.min(2).to_string()])
        .args(["-T", &secs.to_string()])
        .arg(url)
        .stdin(Stdio::null());
    let output = within(Duration::from_secs(secs + 60), "pgbench", async move {
        tokio::task::spawn_blocking(move || cmd.output())
            .await
            .ctx("pgbench task")?
            .ctx("run pgbench")
    })
    .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "pgbench failed ({}): {}",
            output.status,
            stderr.lines().rev().take(5).collect::<Vec<_>>().join(" / ")
        ));
    }
    let tps = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("no `tps = ` line in pgbench output: {stdout}"))?;
    let txns = stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("number of transactions actually processed: ")
        })
        .and_then(|rest| rest.split('/').next())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Ok((txns, tps))
}

async fn writer_throughput(
    ctx: Arc<Ctx>,
    variant: WriterVariant,
    clients: usize,
    secs: u64,
) -> Res<Row> {
    const S: &str = "3 writer throughput";
    let mut row = Row::new(S, &format!("{}, {clients} clients", variant.label));
    let db = fresh_db(&ctx).await?;
    exec(&db.client, SETUP_SQL, Duration::from_secs(30)).await?;
    match variant.trigger {
        Trigger::None => {
            exec(
                &db.client,
                "DROP TRIGGER outbox_events_notify ON outbox_events",
                Duration::from_secs(30),
            )
            .await?
        }
        Trigger::ClassicPerRow => {
            exec(&db.client, CLASSIC_TRIGGER_SQL, Duration::from_secs(30)).await?
        }
        Trigger::Ours => {}
    }
    checkpoint(&ctx, &db.client).await?;
    let notifies = NotifyCounter::start(&db.url).await?;

    let relay_url = format!("{}{}", db.url, variant.url_suffix);
    let mut relays = vec![RelayProc::spawn(
        &ctx,
        &format!("writers-{}-{clients}", slug(variant.label)),
        &relay_url,
        &args(variant.relay_args),
    )?];
    let polling = variant.relay_args.contains(&"poll");
    if polling {
        // A polling relay never arms: give it the time to connect.
        tokio::time::sleep(Duration::from_millis(500)).await;
        relays[0].check_alive()?;
    } else if !wait_armed(&db.client, &mut relays, Duration::from_secs(15)).await? {
        row.note("relay not seen armed within 15 s");
    }

    let (txns, tps) = match &ctx.pgbench {
        Some(pgbench) => run_pgbench(pgbench, &db.url, clients, secs).await?,
        None => {
            let (n, s) = run_writers(&db.url, clients, Duration::from_secs(secs)).await?;
            row.note("tokio-postgres writers (pgbench not found)");
            (n, n as f64 / s)
        }
    };
    relays[0].check_alive()?;
    let left = pending(&db.client).await?;
    let notified = notifies.settled().await;
    // Every relay batch stamps its rows with its transaction's now(): distinct values = batches.
    let batches = query_i64(
        &db.client,
        "SELECT count(DISTINCT processed_at) FROM outbox_events WHERE processed_at IS NOT NULL",
    )
    .await?;
    row.peak_rss_mb = max_rss(&relays);
    stop_all(relays, &mut row).await;
    row.events = Some(txns);
    row.seconds = Some(secs as f64);
    row.writer_tps = Some(tps);
    row.note(notify_share(notified, txns));
    row.note(format!(
        "relay committed {batches} batches during the run; pending when writers stopped: {left}"
    ));
    let db_url = db.url.clone();
    drop(db);
    drop_db(&ctx, &db_url).await;
    Ok(row)
}

async fn scenario_writers(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "3 writer throughput";
    let secs = if ctx.quick { 2 } else { 10 };
    // Quick mode: only the contended case, where a commit-time NOTIFY lock shows.
    let client_counts: &[usize] = if ctx.quick { &[16] } else { &[1, 4, 16] };
    let mut rows: Vec<(WriterVariant, usize, Row)> = Vec::new();
    // Interleaved: all variants back to back for each client count (a fresh database each).
    for &clients in client_counts {
        for variant in WRITER_VARIANTS {
            if variant.diagnostic && ctx.quick {
                continue;
            }
            let name = format!("{}, {clients} clients", variant.label);
            let fut = writer_throughput(ctx.clone(), variant, clients, secs);
            let row = isolated(S, name, Duration::from_secs(secs + 120), fut).await;
            rows.push((variant, clients, row));
        }
    }
    let baseline: HashMap<usize, f64> = rows
        .iter()
        .filter(|(v, _, _)| v.trigger == Trigger::None && !v.diagnostic)
        .filter_map(|(_, c, r)| r.writer_tps.map(|tps| (*c, tps)))
        .collect();
    let tool = if ctx.pgbench.is_some() {
        format!("pgbench -c N -j min(2,N) -T {secs}")
    } else {
        format!("tokio-postgres writers, {secs} s")
    };
    rows.into_iter()
        .map(|(variant, clients, mut row)| {
            if let (Some(tps), Some(base)) = (row.writer_tps, baseline.get(&clients)) {
                if (variant.trigger != Trigger::None || variant.diagnostic) && *base > 0.0 {
                    row.note(format!("{:.2}x of (a)", tps / base));
                }
            }
            if !row.is_failure() {
                row.note(if variant.diagnostic {
                    format!("{tool}; diagnostic variant (not CLI defaults)")
                } else {
                    format!("{tool}; relay running, CLI defaults")
                });
            }
            row
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Scenario 4: sustained load
// ---------------------------------------------------------------------------------------------

async fn sustained(ctx: Arc<Ctx>, writers: usize, secs: u64) -> Res<Row> {
    const S: &str = "4 sustained load";
    let mut row = Row::new(S, &format!("{writers} writers, full speed, {secs} s"));
    let db = fresh_db(&ctx).await?;
    exec(&db.client, SETUP_SQL, Duration::from_secs(30)).await?;
    checkpoint(&ctx, &db.client).await?;

    // Commit -> receipt latency from the writer's wall clock carried in the payload.
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::new(Mutex::new(Vec::new()));
    let (_nc, mut sub) = subscribe_all(&ctx.nats_url).await?;
    let receiver = {
        let latencies = latencies.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let now_us = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as i64);
                let ts = serde_json::from_slice::<serde_json::Value>(&msg.payload)
                    .ok()
                    .and_then(|v| v.get("ts_us").and_then(serde_json::Value::as_i64));
                if let Some(ts) = ts {
                    latencies
                        .lock()
                        .expect("latency list lock")
                        .push((now_us - ts) as f64 / 1000.0);
                }
            }
        })
    };
    let _abort_receiver = AbortOnDrop(receiver);

    let notifies = NotifyCounter::start(&db.url).await?;
    let mut relays = vec![RelayProc::spawn(&ctx, "sustained", &db.url, &[])?];
    if !wait_armed(&db.client, &mut relays, Duration::from_secs(15)).await? {
        row.note("relay not seen armed within 15 s");
    }

    // Pending count every 200 ms while the writers run.
    let stop_sampling = CancellationToken::new();
    let sampler = {
        let stop = stop_sampling.clone();
        let sampler_client = pg_client(&db.url).await;
        tokio::spawn(async move {
            let mut samples: Vec<i64> = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                if let Ok(n) = pending(&sampler_client).await {
                    samples.push(n);
                }
            }
            samples
        })
    };

    let notified_before = notifies.settled().await;
    let (committed, elapsed) = run_writers(&db.url, writers, Duration::from_secs(secs)).await?;
    let pending_at_end = pending(&db.client).await?;
    let notified = notifies.settled().await - notified_before;
    stop_sampling.cancel();
    let samples = within(Duration::from_secs(10), "pending sampler", async {
        sampler.await.ctx("pending sampler task")
    })
    .await?;
    let stopped = Instant::now();

    // Catch-up: pending to zero and every event received.
    let deadline = stopped + Duration::from_secs(60);
    loop {
        relays[0].check_alive()?;
        if pending(&db.client).await? == 0 {
            break;
        }
        if Instant::now() >= deadline {
            return Err("the relay did not catch up within 60 s after the writers stopped".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let caught_up = stopped.elapsed().as_secs_f64();
    let recv_deadline = Instant::now() + Duration::from_secs(15);
    while (latencies.lock().expect("latency list lock").len() as u64) < committed
        && Instant::now() < recv_deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    row.peak_rss_mb = max_rss(&relays);
    stop_all(relays, &mut row).await;

    let (processed, span) = processed_span(&db.client).await?;
    row.events = Some(committed);
    row.seconds = Some(elapsed);
    row.writer_tps = Some(committed as f64 / elapsed);
    if span > 0.0 {
        row.events_per_s = Some(processed as f64 / span);
    }
    let mut lat = latencies.lock().expect("latency list lock").clone();
    if (lat.len() as u64) < committed {
        row.note(format!(
            "{} of {committed} NOT RECEIVED",
            committed - lat.len() as u64
        ));
    }
    set_latency(&mut row, &mut lat);
    let max_pending = samples.iter().copied().max().unwrap_or(0);
    let half = samples.len() / 2;
    let first_half = samples[..half].iter().copied().max().unwrap_or(0);
    let second_half = samples[half..].iter().copied().max().unwrap_or(0);
    // Bounded: the backlog does not keep growing through the run, and what is left at the end is
    // at most about half a second of writes.
    let bounded = second_half <= first_half.saturating_mul(2).max(200)
        && (pending_at_end as f64) <= (committed as f64 / elapsed * 0.5).max(200.0);
    row.note(format!(
        "pending: max {max_pending} (sampled every 200 ms, {} samples; max 1st half {first_half}, 2nd half {second_half}), {pending_at_end} when writers stopped -> {}",
        samples.len(),
        if bounded { "bounded" } else { "GROWING" }
    ));
    row.note(format!("caught up {caught_up:.2}s after writers stopped"));
    row.note(notify_share(notified, committed));
    row.note("latency = receipt wall clock - clock_timestamp() at the outbox insert (autocommit, business row + outbox row)");
    let db_url = db.url.clone();
    drop(db);
    drop_db(&ctx, &db_url).await;
    Ok(row)
}

async fn scenario_sustained(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "4 sustained load";
    let secs = if ctx.quick { 3 } else { 10 };
    let variant = format!("4 writers, full speed, {secs} s");
    let fut = sustained(ctx.clone(), 4, secs);
    vec![isolated(S, variant, Duration::from_secs(secs + 150), fut).await]
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

const SCENARIOS: [&str; 5] = ["drain", "idle-latency", "writers", "sustained", "relays"];

async fn run_scenario(name: &str, ctx: Arc<Ctx>) -> Vec<Row> {
    match name {
        "drain" => scenario_drain(ctx).await,
        "idle-latency" => scenario_idle_latency(ctx).await,
        "writers" => scenario_writers(ctx).await,
        "sustained" => scenario_sustained(ctx).await,
        "relays" => scenario_relays(ctx).await,
        other => vec![Row::failed(other, "-", "unknown scenario")],
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(non-string panic)".into())
}

fn main() {
    let quick = std::env::var("OUTBOX_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    // cargo passes `--bench`; other arguments select scenarios by name.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected: Vec<&str> = SCENARIOS
        .into_iter()
        .filter(|name| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    let out_dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench"));
    let log_dir = out_dir.join("logs");
    if let Err(e) = std::fs::create_dir_all(&log_dir) {
        eprintln!("[bench] cannot create {}: {e}", log_dir.display());
    }
    let started = Instant::now();

    let servers = std::panic::catch_unwind(|| {
        let pg = PgCluster::start(PgOptions {
            fsync: true,
            ..Default::default()
        });
        let nats = NatsServer::start();
        (pg, nats)
    });
    let mut rows: Vec<Row> = Vec::new();
    let mut nats_keep = None;
    match servers {
        Err(payload) => {
            let msg = panic_text(&*payload);
            for name in &selected {
                rows.push(Row::failed(
                    name,
                    "-",
                    &format!("servers did not start: {msg}"),
                ));
            }
        }
        Ok((pg, nats)) => {
            let ctx = Arc::new(Ctx {
                pg,
                nats_url: nats.url(),
                quick,
                pgbench: find_pgbench(),
                log_dir,
            });
            nats_keep = Some(nats);
            eprintln!(
                "[bench] servers up in {:.1}s; mode {}, postgres on port {} (fsync on), {}, pgbench: {}",
                started.elapsed().as_secs_f64(),
                if quick { "quick" } else { "full" },
                ctx.pg.port(),
                ctx.nats_url,
                ctx.pgbench
                    .as_deref()
                    .map_or("not found".into(), |p| p.display().to_string())
            );
            match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => {
                    for name in &selected {
                        rows.extend(rt.block_on(run_scenario(name, ctx.clone())));
                    }
                    drop(rt);
                }
                Err(e) => rows.push(Row::failed("-", "-", &format!("tokio runtime: {e}"))),
            }
            drop(ctx);
        }
    }
    drop(nats_keep);

    let failures = rows.iter().filter(|r| r.is_failure()).count();
    println!();
    println!(
        "## outbox-relay benchmarks ({} mode, {:.0} s, {} cores, PostgreSQL fsync on)",
        if quick { "quick" } else { "full" },
        started.elapsed().as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!();
    print!("{}", markdown_table(&rows));
    let json_path = out_dir.join("results.json");
    match serde_json::to_string_pretty(&rows) {
        Ok(json) => match std::fs::write(&json_path, json + "\n") {
            Ok(()) => println!("\nresults: {}", json_path.display()),
            Err(e) => eprintln!("[bench] cannot write {}: {e}", json_path.display()),
        },
        Err(e) => eprintln!("[bench] cannot serialize results: {e}"),
    }
    if failures > 0 {
        eprintln!("[bench] {failures} row(s) FAILED");
        std::process::exit(1);
    }
}
