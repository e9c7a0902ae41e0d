//! The atomic rows of the `drain` and `wal` scenarios (scenarios `drain-atomic` and `wal-atomic`,
//! which `-- drain` and `-- wal` select with them; `-- atomic` runs only these): a backlog written
//! as transactions of N events (N = 1, 10, 100; quick mode: 10), drained with
//! `--transactions events` (the default) and with `--transactions atomic`, one right after the
//! other for each N and source, so that the atomic/events ratio is read within one run.
//!
//! The backlog holds the same rows as the other drains' (`BACKLOG_SQL`: same payloads, aggregates
//! interleaved), only committed N at a time: `txid` records each row's transaction, and a backlog
//! of one big INSERT would be one transaction. Both modes drain into a stream with `allow_atomic`,
//! so that the relay's mode is the only difference between the two rows of a pair.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio_postgres::Client;

use testkit::outbox::STREAM;

use crate::drain::{drain_variant, Drainer};
use crate::env::*;
use crate::report::Row;

/// The scenarios these rows belong to (the labels of `drain.rs` and `wal.rs`).
const DRAIN: &str = "1 backlog drain";
const WAL: &str = "6 wal source";

/// Events per transaction of the backlogs.
fn sizes(ctx: &Ctx) -> &'static [u64] {
    if ctx.quick {
        &[10]
    } else {
        &[1, 10, 100]
    }
}

#[derive(Clone, Copy)]
enum Source {
    Table,
    Wal,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Table => "table source",
            Source::Wal => "wal source",
        }
    }

    fn drainer(self, mode: &str) -> Drainer {
        let args = args(&["--transactions", mode]);
        match self {
            Source::Table => Drainer::Relays { count: 1, args },
            Source::Wal => Drainer::Wal { args },
        }
    }
}

pub(crate) async fn scenario_drain_atomic(ctx: Arc<Ctx>) -> Vec<Row> {
    pairs(ctx, DRAIN, &[Source::Table]).await
}

pub(crate) async fn scenario_wal_atomic(ctx: Arc<Ctx>) -> Vec<Row> {
    pairs(ctx, WAL, &[Source::Table, Source::Wal]).await
}

/// For each size and source, a drain in each mode; the atomic row notes its rate as a share of the
/// events row's.
async fn pairs(ctx: Arc<Ctx>, scenario: &'static str, sources: &[Source]) -> Vec<Row> {
    let events = ctx.backlog();
    let mut rows = Vec::new();
    for &n in sizes(&ctx) {
        let backlog = Backlog {
            per_transaction: n,
            ..Backlog::new(events)
        };
        for &source in sources {
            let mut pair = Vec::new();
            for mode in ["events", "atomic"] {
                let variant = format!(
                    "transactions of {n}, {}, --transactions {mode}",
                    source.name()
                );
                // The insert of N-event transactions takes longer than the usual backlog's, and
                // atomic batches of few events drain slowly (PERFORMANCE.md).
                let limit = ctx.drain_timeout(events, true) + insert_timeout(events);
                let fut = drain_variant(
                    ctx.clone(),
                    scenario,
                    variant.clone(),
                    backlog,
                    source.drainer(mode),
                    true,
                );
                let mut row = isolated(scenario, variant, limit, fut).await;
                // The drain charts stay those of the other rows.
                row.timeline = None;
                pair.push(row);
            }
            if let [events_row, atomic_row] = pair.as_mut_slice() {
                if let (Some(e), Some(a)) = (events_row.events_per_s, atomic_row.events_per_s) {
                    if e > 0.0 {
                        atomic_row.note(format!("{:.2}x the events row's rate", a / e));
                    }
                }
            }
            rows.extend(pair);
        }
    }
    rows
}

fn insert_timeout(events: u64) -> Duration {
    Duration::from_secs(events / 1_000 + 120)
}

/// Writes `backlog` (`per_transaction` > 0) as transactions of that many events: rows `g` of
/// `BACKLOG_SQL`, consecutive `g` in one transaction, in a `DO` loop that commits after each
/// (asynchronous commits: the insert is setup, the CHECKPOINT after it makes it durable).
pub(crate) async fn insert_in_transactions(client: &Client, backlog: Backlog) -> Res<()> {
    let events = backlog.events;
    let n = backlog.per_transaction.max(1);
    let aggregates = (events / backlog.per_aggregate.max(1)).max(1);
    // The same statement, its parameters as the loop's variables.
    let insert = BACKLOG_SQL
        .replace("$1", "lo")
        .replace("$2", "hi")
        .replace("$3", "aggs");
    let sql = format!(
        "DO $do$
DECLARE
    lo int := 0;
    hi int;
    aggs int := {aggregates};
BEGIN
    WHILE lo < {events} LOOP
        hi := least(lo + {n}, {events}) - 1;
        {insert};
        COMMIT;
        lo := hi + 1;
    END LOOP;
END
$do$"
    );
    exec(
        client,
        "SET synchronous_commit = off",
        Duration::from_secs(10),
    )
    .await?;
    // Alone in its query string: COMMIT in a DO block needs a top-level statement.
    exec(client, &sql, insert_timeout(events)).await?;
    exec(client, "RESET synchronous_commit", Duration::from_secs(10)).await
}

/// After `reset_stream`, for a backlog of N-event transactions: the stream takes atomic batches
/// (`allow_atomic`), which `--transactions atomic` needs, in both modes.
pub(crate) async fn prepare_stream(nats_url: &str, backlog: Backlog) -> Res<()> {
    if backlog.per_transaction == 0 {
        return Ok(());
    }
    let js = jetstream::new(nats_client(nats_url).await?);
    within(Duration::from_secs(30), "allow atomic batches", async {
        let mut stream = js.get_stream(STREAM).await.ctx("get stream")?;
        let mut config = stream.info().await.ctx("stream info")?.config.clone();
        config.allow_atomic_publish = true;
        let info = js.update_stream(config).await.ctx("update stream")?;
        if !info.config.allow_atomic_publish {
            return Err("the server dropped allow_atomic from the stream (before 2.12?)".into());
        }
        Ok(())
    })
    .await
}
