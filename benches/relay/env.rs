//! What every scenario uses: the servers, fresh databases, the relay as a child process,
//! running a variant in isolation.

use std::fmt::Display;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use tokio_postgres::Client;

use testkit::outbox::STREAM;
use testkit::{pg_client, PgCluster, RelayProcess};

use crate::report::*;

pub(crate) type Res<T> = Result<T, String>;

/// Adds what was being done to an error.
pub(crate) trait Context<T> {
    fn ctx(self, what: &str) -> Res<T>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Res<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = Res<T>>,
) -> Res<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| format!("{what}: timed out after {limit:?}"))?
}

pub(crate) const SUBJECTS: &str = "outbox.>";
pub(crate) const SETUP_SQL: &str = include_str!("../setup.sql");
pub(crate) const CLASSIC_TRIGGER_SQL: &str = include_str!("../classic_trigger.sql");
pub(crate) const WRITER_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/writer.sql");

/// Advisory key an idle relay holds while it waits for notifications (see the migration's
/// `outbox_events_notify`), as pg_locks shows it: classid = high 32 bits, objid = low 32 bits.
pub(crate) const ARMED_SQL: &str = "SELECT EXISTS (SELECT 1 FROM pg_locks \
     WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted \
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
       AND classid = 1 AND objid = 2955042706 AND objsubid = 1)";

pub(crate) const PENDING_SQL: &str =
    "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL";

/// What the drain polls every 50 ms: the same question as `PENDING_SQL = 0`, answered from the
/// first live entry of the pending index instead of counting them all (a count of a 100k backlog
/// every 50 ms costs the 2-core machine a good part of a core, and slows the relay it measures).
pub(crate) const ANY_PENDING_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM outbox_events WHERE processed_at IS NULL)";

/// The backlog: ~10 events per aggregate, aggregates interleaved (row g belongs to aggregate
/// g % $3), so consecutive rows are different aggregates and each aggregate's events are spread
/// over the whole table. The payload renders as ~150 bytes of JSON.
pub(crate) const BACKLOG_SQL: &str = "\
INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'order-' || (g % $3::int), 'order.updated',
       jsonb_build_object('order_id', g % $3::int, 'step', g / $3::int,
                          'customer_id', 'cust-' || lpad((g % 5000)::text, 5, '0'),
                          'amount_cents', (g * 7919) % 100000, 'currency', 'EUR',
                          'status', 'confirmed', 'note', 'leave at the door')
FROM generate_series($1::int, $2::int) AS g";

/// One writer transaction in a single statement (autocommit): a business row and its outbox row.
/// `ts_us` is the wall clock at the outbox insert, right before the implicit commit.
pub(crate) const WRITER_SQL: &str = "\
WITH o AS (
    INSERT INTO bench_orders (customer_id, amount_cents, status) VALUES ($1, $2, 'new')
    RETURNING id, customer_id, amount_cents)
INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', o.id::text, 'order.created',
       jsonb_build_object('order_id', o.id, 'customer_id', o.customer_id,
                          'amount_cents', o.amount_cents, 'currency', 'EUR', 'status', 'new',
                          'ts_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
FROM o";

pub(crate) struct Ctx {
    pub(crate) pg: PgCluster,
    pub(crate) nats_url: String,
    /// nats-server's process, for its CPU time.
    pub(crate) nats_pid: Option<u32>,
    pub(crate) quick: bool,
    pub(crate) pgbench: Option<PathBuf>,
    pub(crate) log_dir: PathBuf,
}

impl Ctx {
    pub(crate) fn backlog(&self) -> u64 {
        if self.quick {
            10_000
        } else {
            100_000
        }
    }

    /// Bound on one drain: generous, but a stuck relay cannot hold the bench forever.
    pub(crate) fn drain_timeout(&self, events: u64, classic: bool) -> Duration {
        let per_s = if classic { 400 } else { 1_500 };
        Duration::from_secs((events / per_s).max(30) + 30)
    }
}

/// A fresh migrated database (its own `outbox_events`) and an empty `OUTBOX` stream.
pub(crate) struct Db {
    pub(crate) url: String,
    pub(crate) client: Client,
}

pub(crate) async fn fresh_db(ctx: &Ctx) -> Res<Db> {
    let url = ctx.pg.create_migrated_database().await;
    let client = pg_client(&url).await;
    reset_stream(&ctx.nats_url).await?;
    Ok(Db { url, client })
}

/// Drops a database of an earlier variant (best effort: it only keeps the cluster small). Not in
/// quick mode, where the few small databases go with the cluster (a drop costs a checkpoint).
pub(crate) async fn drop_db(ctx: &Ctx, url: &str) {
    if ctx.quick {
        return;
    }
    let Some(name) = url.rsplit('/').next() else {
        return;
    };
    let admin = pg_client(&ctx.pg.url("postgres")).await;
    // A replication slot (`--source wal`) keeps its database from being dropped.
    let slots = "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE database = $1 AND NOT active";
    if let Err(e) = admin.execute(slots, &[&name]).await {
        eprintln!("[bench] warning: dropping the slots of {name}: {e}");
    }
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
pub(crate) async fn subscribe_all(url: &str) -> Res<(async_nats::Client, async_nats::Subscriber)> {
    let nc = nats_client(url).await?;
    let sub = nc.subscribe(SUBJECTS).await.ctx("subscribe")?;
    within(Duration::from_secs(10), "flush", async {
        nc.flush().await.ctx("flush")
    })
    .await?;
    Ok((nc, sub))
}

pub(crate) async fn nats_client(url: &str) -> Res<async_nats::Client> {
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
pub(crate) async fn reset_stream(nats_url: &str) -> Res<()> {
    let js = jetstream::new(nats_client(nats_url).await?);
    within(Duration::from_secs(60), "reset stream", async {
        // A missing stream is fine; any other trouble shows in the create below.
        let _ = js.delete_stream(STREAM).await;
        js.create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec![SUBJECTS.into()],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(600),
            // Fast-ingest batches (the rows with --publish-batches fast-ingest); nothing else
            // changes for a per-message publish.
            allow_batch_publish: true,
            ..Default::default()
        })
        .await
        .ctx("create stream")?;
        Ok(())
    })
    .await
}

/// (messages in the stream, seconds between its first and its last message as JetStream stamped
/// them): the drain's span where the relay keeps no `processed_at` (`--wal-marking delete`), and
/// the same measure for every drain.
pub(crate) async fn stream_span(nats_url: &str) -> Res<(u64, f64)> {
    let js = jetstream::new(nats_client(nats_url).await?);
    within(Duration::from_secs(30), "stream span", async {
        let mut s = js.get_stream(STREAM).await.ctx("get stream")?;
        let state = s.info().await.ctx("stream info")?.state.clone();
        let span = (state.last_timestamp - state.first_timestamp).as_seconds_f64();
        Ok((state.messages, span.max(0.0)))
    })
    .await
}

pub(crate) async fn stream_len(nats_url: &str) -> Res<u64> {
    let js = jetstream::new(nats_client(nats_url).await?);
    within(Duration::from_secs(10), "stream info", async {
        let mut s = js.get_stream(STREAM).await.ctx("get stream")?;
        Ok(s.info().await.ctx("stream info")?.state.messages)
    })
    .await
}

pub(crate) async fn query_i64(client: &Client, sql: &str) -> Res<i64> {
    within(Duration::from_secs(30), sql, async {
        Ok(client.query_one(sql, &[]).await.ctx(sql)?.get::<_, i64>(0))
    })
    .await
}

pub(crate) async fn pending(client: &Client) -> Res<i64> {
    query_i64(client, PENDING_SQL).await
}

/// A CHECKPOINT so that a measurement does not pay for the previous setup's dirty pages (full
/// mode only: it costs about a second on this disk).
pub(crate) async fn checkpoint(ctx: &Ctx, client: &Client) -> Res<()> {
    if ctx.quick {
        return Ok(());
    }
    exec(client, "CHECKPOINT", Duration::from_secs(120)).await
}

pub(crate) async fn exec(client: &Client, sql: &str, limit: Duration) -> Res<()> {
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
pub(crate) struct Backlog {
    pub(crate) events: u64,
    /// Events per aggregate, interleaved across aggregates in seq order.
    pub(crate) per_aggregate: u64,
    /// VACUUM ANALYZE after the insert (else the planner has no statistics of the burst).
    pub(crate) analyze: bool,
    /// Events per writer transaction (`atomic.rs`: also a stream with `allow_atomic`); 0: chunks
    /// of 10,000.
    pub(crate) per_transaction: u64,
}

impl Backlog {
    pub(crate) fn new(events: u64) -> Backlog {
        Backlog {
            events,
            per_aggregate: 10,
            analyze: true,
            per_transaction: 0,
        }
    }

    pub(crate) fn describe(&self) -> String {
        format!(
            "backlog: {} events, {} per aggregate, interleaved{}{}",
            self.events,
            self.per_aggregate,
            if self.per_transaction > 0 {
                format!(", in transactions of {}", self.per_transaction)
            } else {
                String::new()
            },
            if self.analyze {
                ", VACUUM ANALYZE before the drain"
            } else {
                ""
            }
        )
    }
}

pub(crate) async fn insert_backlog(ctx: &Ctx, client: &Client, backlog: Backlog) -> Res<f64> {
    let Backlog {
        events, analyze, ..
    } = backlog;
    let aggregates = (events / backlog.per_aggregate.max(1)).max(1) as i32;
    let mut start = 0u64;
    if backlog.per_transaction > 0 {
        crate::atomic::insert_in_transactions(client, backlog).await?;
        start = events;
    }
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
pub(crate) async fn processed_span(client: &Client) -> Res<(i64, f64)> {
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

/// `--source wal` for the database at `url`: creates its publication and returns the flags naming
/// its slot (after the database: slots are cluster-wide).
pub(crate) async fn wal_slot_args(url: &str) -> Res<Vec<String>> {
    let mut client = pg_client(url).await;
    outbox_relay::ops::Outbox::new(&mut client, None)
        .create_publication()
        .await
        .map_err(|e| format!("create publication: {e}"))?;
    let slot = url.rsplit('/').next().unwrap_or("outbox_relay");
    Ok(args(&["--slot-name", slot]))
}

/// Waits until a relay streams from the slot of `--source wal` (past creating it and catching up).
pub(crate) async fn wait_streaming(
    client: &Client,
    relays: &mut [RelayProcess],
    limit: Duration,
) -> Res<()> {
    const SQL: &str = "SELECT EXISTS (SELECT FROM pg_replication_slots s \
                       JOIN pg_stat_replication r ON r.pid = s.active_pid \
                       WHERE s.database = current_database())";
    let deadline = Instant::now() + limit;
    loop {
        let streaming: bool = within(Duration::from_secs(10), "streaming check", async {
            Ok(client
                .query_one(SQL, &[])
                .await
                .ctx("streaming check")?
                .get(0))
        })
        .await?;
        if streaming {
            return Ok(());
        }
        for r in relays.iter_mut() {
            r.check_alive()?;
        }
        if Instant::now() >= deadline {
            return Err(format!("the relay did not stream within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// CPU seconds (user + system) of the processes that matter, from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    pub(crate) relays: f64,
    pub(crate) postgres: f64,
    pub(crate) nats: f64,
}

impl Cpu {
    /// Now: the relays', nats-server's, and PostgreSQL's (the postmaster with its reaped children
    /// and every live child: backends, walsenders, background workers).
    pub(crate) fn read(ctx: &Ctx, relays: &[RelayProcess]) -> Cpu {
        let postgres = ctx.pg.pid().map_or(0.0, |pm| {
            let children: f64 = children_of(pm).iter().map(|&p| proc_cpu(p, false)).sum();
            proc_cpu(pm, true) + children
        });
        Cpu {
            relays: relays.iter().map(|r| proc_cpu(r.pid(), false)).sum(),
            postgres,
            nats: ctx.nats_pid.map_or(0.0, |p| proc_cpu(p, false)),
        }
    }

    /// `CPU per event: relay X, postgres Y, nats-server Z µs` since `before`.
    pub(crate) fn per_event(&self, before: &Cpu, events: u64) -> String {
        let us = |after: f64, before: f64| (after - before) * 1e6 / events.max(1) as f64;
        format!(
            "CPU per event: relay {:.1}, postgres {:.1}, nats-server {:.1} us",
            us(self.relays, before.relays),
            us(self.postgres, before.postgres),
            us(self.nats, before.nats)
        )
    }
}

/// utime + stime of `pid` (with `reaped`: plus its reaped children's), in seconds.
pub(crate) fn proc_cpu(pid: u32, reaped: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name (which may hold spaces), from field 3 on.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // utime = field 14, stime 15, cutime 16, cstime 17 (field 3 is f[0]).
    let get = |n: usize| f.get(n - 3).copied().unwrap_or(0.0);
    let ticks = get(14) + get(15) + if reaped { get(16) + get(17) } else { 0.0 };
    ticks / 100.0
}

fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_string();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// Waits until an idle relay holds the arming key (it listens and writers notify it).
pub(crate) async fn wait_armed(
    client: &Client,
    relays: &mut [RelayProcess],
    limit: Duration,
) -> Res<bool> {
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
pub(crate) fn find_pgbench() -> Option<PathBuf> {
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

/// The relay binary: this build's, or `OUTBOX_BENCH_RELAY_BIN` (another build to compare with, in
/// the same run on the same machine).
pub(crate) fn relay_bin() -> String {
    std::env::var("OUTBOX_BENCH_RELAY_BIN")
        .unwrap_or_else(|_| testkit::relay_bin().display().to_string())
}

/// `outbox-relay run` in a child process (its stderr in `<log_dir>/<name>.log`); killed on drop,
/// and by the kernel if the bench dies.
pub(crate) fn spawn_relay(
    ctx: &Ctx,
    name: &str,
    db_url: &str,
    extra: &[String],
) -> Res<RelayProcess> {
    let log = ctx.log_dir.join(format!("{name}.log"));
    let log_file = std::fs::File::create(&log).ctx(&format!("create {}", log.display()))?;
    let bin = relay_bin();
    let mut cmd = Command::new(&bin);
    cmd.arg("run")
        .args(["--database-url", db_url])
        .args(["--nats-url", &ctx.nats_url]);
    if !extra.iter().any(|a| a == "--metrics-addr") {
        cmd.args(["--metrics-addr", "off"]);
    }
    cmd.args(extra)
        .env(
            "RUST_LOG",
            std::env::var("OUTBOX_BENCH_RELAY_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    RelayProcess::spawn(name, cmd, Some(log)).ctx(&format!("spawn {bin}"))
}

pub(crate) fn max_rss(relays: &[RelayProcess]) -> Option<f64> {
    relays
        .iter()
        .filter_map(RelayProcess::peak_rss_mb)
        .reduce(f64::max)
}

pub(crate) async fn stop_all(relays: Vec<RelayProcess>, row: &mut Row) {
    for r in relays {
        if let Some(note) = r.stop().await {
            row.note(note);
        }
    }
}

pub(crate) fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------------------------
// Running variants in isolation
// ---------------------------------------------------------------------------------------------

/// Runs one variant on a task of its own, bounded: an error, a panic or a timeout becomes a
/// FAILED row (the task is aborted, which kills its relays), never the end of the bench.
pub(crate) async fn isolated<F>(
    scenario: &'static str,
    variant: String,
    limit: Duration,
    fut: F,
) -> Row
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

pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection of the bench's own that LISTENs on `outbox_event` and counts what arrives: with the
/// migration's trigger (one notification per transaction at most, identical ones are folded) this
/// is the number of writer transactions that notified.
pub(crate) struct NotifyCounter {
    pub(crate) count: Arc<AtomicU64>,
    pub(crate) _client: Client,
    pub(crate) _task: AbortOnDrop<()>,
}

impl NotifyCounter {
    pub(crate) async fn start(url: &str) -> Res<NotifyCounter> {
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
    pub(crate) async fn settled(&self) -> u64 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.count.load(AtomicOrdering::Relaxed)
    }
}

/// `outbox_wakeups_total{reason="notify"}` of a relay serving `/metrics` on `addr`: how often a
/// notification woke it from waiting.
pub(crate) async fn notify_wakeups(addr: std::net::SocketAddr) -> Option<u64> {
    let (_, body) = testkit::http_get(addr, "/metrics").await?;
    // The series appears with the first such wake-up.
    let value = body
        .lines()
        .find_map(|l| l.strip_prefix("outbox_wakeups_total{reason=\"notify\"} "))
        .map_or(Some(0.0), |v| v.trim().parse::<f64>().ok())?;
    Some(value as u64)
}

pub(crate) fn notify_share(notified: u64, txns: u64) -> String {
    let pct = if txns > 0 {
        notified as f64 * 100.0 / txns as f64
    } else {
        0.0
    };
    format!("NOTIFY in {notified} of {txns} writer txns ({pct:.2}%)")
}
pub(crate) fn slug(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}
