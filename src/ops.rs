//! Operator queries: status, dead letters, cleanup (of the outbox and of `processed_events`).
//! Shared by the CLI and the relay's own periodic tasks (gauges, `--retention`,
//! `--processed-events-retention`).
//!
//! Every statement is sent as an unnamed statement with its parameter types (one round trip, no
//! named prepared statement left on the server), so these work through a transaction pooler such
//! as PgBouncer in transaction mode.
//!
//! The `*_in` functions are the operator commands as the CLI runs them: each in a transaction of
//! its own (cleanup: one per batch) that first sets the search_path to the outbox schema with
//! `SET LOCAL` ([`transaction_in`]) and checks the schema version. Nothing of that outlives the
//! transaction, so the server connection goes back to a pooler unchanged, and `--schema` needs no
//! `options` in the connection URL (which PgBouncer refuses).
//!
//! ```no_run
//! # async fn example() -> outbox_relay::Result<()> {
//! use std::time::Duration;
//! use outbox_relay::ops;
//!
//! let mut client = outbox_relay::connect("postgres://relay@db:5432/app", "ops").await?;
//! let status = ops::status_in(&mut client, None).await?;
//! println!("{} pending, {} dead letters", status.pending, status.dead_letters);
//! for dead in ops::dead_letters_in(&mut client, None, 20, None).await? {
//!     println!("{} {}: {:?}", dead.id, dead.event_type, dead.last_error);
//! }
//! let retried = ops::retry_dead_letters_in(&mut client, None, None).await?; // all of them
//! let week = Duration::from_secs(7 * 24 * 3600);
//! let deleted = ops::cleanup_in(&mut client, None, week, 1000).await?;
//! println!("retried {}, deleted {deleted} old rows", retried.len());
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, Transaction};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::migrate::check_schema;
use crate::timestamp::Timestamp;

const STATUS: &str = include_str!("../sql/queries/status.sql");
const DEAD_LETTERS_LIST: &str = include_str!("../sql/queries/dead_letters_list.sql");
const DEAD_LETTERS_RETRY: &str = include_str!("../sql/queries/dead_letters_retry.sql");
const DEAD_LETTERS_DISCARD: &str = include_str!("../sql/queries/dead_letters_discard.sql");
const WAKE: &str = include_str!("../sql/queries/wake.sql");
const CLEANUP: &str = include_str!("../sql/queries/cleanup.sql");
const CLEANUP_PROCESSED_EVENTS: &str = include_str!("../sql/queries/cleanup_processed_events.sql");
const CLEANUP_COUNT: &str = include_str!("../sql/queries/cleanup_count.sql");
const CLEANUP_PROCESSED_EVENTS_COUNT: &str =
    include_str!("../sql/queries/cleanup_processed_events_count.sql");
const DEAD_LETTERS_RETRY_BATCH: &str = include_str!("../sql/queries/dead_letters_retry_batch.sql");
const DEAD_LETTERS_RETRY_PREVIEW: &str =
    include_str!("../sql/queries/dead_letters_retry_preview.sql");
const BLOCKED_AGGREGATES: &str = include_str!("../sql/queries/blocked_aggregates.sql");
const WAL_PRESENT: &str = include_str!("../sql/queries/wal_present.sql");
const WAL_SLOTS: &str = include_str!("../sql/queries/wal_slots.sql");

/// What `outbox-relay status` reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Status {
    /// Not yet published and not dead-lettered.
    pub pending: i64,
    /// Age of the oldest pending event by the database's clock (0 when none); never negative: an
    /// event dated in the future counts as age 0 (see `future_dated`).
    pub oldest_pending_age_seconds: f64,
    /// Failed at least once, waiting for their next try.
    pub waiting_for_retry: i64,
    /// Of those, due now.
    pub due_for_retry: i64,
    /// Dead letters waiting for an operator.
    pub dead_letters: i64,
    /// Aggregates whose later events wait behind a dead letter.
    pub blocked_aggregates: i64,
    /// Pending events dated in the future by the database's clock: a writer's clock ahead of the
    /// database's, or a `created_at` set by SQL. They count as age 0 in
    /// `oldest_pending_age_seconds`.
    pub future_dated: i64,
    /// How far ahead of the database's clock the furthest of them is dated, in seconds (0 when
    /// none; a `created_at` of `infinity` is counted in `future_dated`, not here).
    pub max_future_skew_seconds: f64,
    /// The `seq` of the first of them in the queue: the relay ages it from when it first saw it,
    /// for `outbox_oldest_pending_age_seconds`.
    #[serde(skip)]
    pub(crate) first_future_dated_seq: Option<i64>,
}

/// Opens a transaction on `client` whose statements find the outbox objects in `schema`: it
/// starts with `SET LOCAL search_path TO <schema>`, which ends with the transaction (commit or
/// rollback), so no session state is left on the connection. `None`: the connection's own
/// search_path, and the transaction is a plain one.
///
/// Fails with a configuration error naming `schema` when the name is not a plain lowercase
/// identifier (see [`crate::db::validate_schema`]).
pub async fn transaction_in<'a>(
    client: &'a mut Client,
    schema: Option<&str>,
) -> Result<Transaction<'a>> {
    if let Some(schema) = schema {
        crate::db::validate_schema(schema)?;
    }
    let tx = client.transaction().await?;
    if let Some(schema) = schema {
        tx.batch_execute(&crate::db::set_local_search_path(schema))
            .await?;
    }
    Ok(tx)
}

/// [`transaction_in`], after checking in it that the schema is there and current.
pub async fn checked_transaction_in<'a>(
    client: &'a mut Client,
    schema: Option<&str>,
) -> Result<Transaction<'a>> {
    let tx = transaction_in(client, schema).await?;
    check_schema(&tx).await?;
    Ok(tx)
}

/// The status of the outbox in the connection's current search_path.
pub async fn status<C: GenericClient + Sync>(client: &C) -> Result<Status> {
    let row = client.query_typed_one(STATUS, &[]).await?;
    Ok(Status {
        pending: row.get("pending"),
        oldest_pending_age_seconds: row.get("oldest_pending_age_seconds"),
        waiting_for_retry: row.get("waiting_for_retry"),
        due_for_retry: row.get("due_for_retry"),
        dead_letters: row.get("dead_letters"),
        blocked_aggregates: row.get("blocked_aggregates"),
        future_dated: row.get("future_dated"),
        max_future_skew_seconds: row.get("max_future_skew_seconds"),
        first_future_dated_seq: row.get("first_future_dated_seq"),
    })
}

/// A replication slot of `--source wal` (one this outbox's relays created), as PostgreSQL sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WalSlot {
    /// The slot's name (`--slot-name`).
    pub slot_name: String,
    /// The slot exists (an operator may have dropped it; the relay creates it again).
    pub present: bool,
    /// A relay streams from it now.
    pub active: bool,
    /// PostgreSQL's `wal_status`: `reserved`, `extended`, `unreserved`, or `lost` (invalidated by
    /// `max_slot_wal_keep_size`; the relay recreates it and catches up from the table).
    pub wal_status: Option<String>,
    /// WAL the slot keeps on the server, in bytes (`outbox_replication_lag_bytes`).
    pub retained_bytes: f64,
    /// WAL past the position the relay confirmed, in bytes.
    pub unconfirmed_bytes: f64,
    /// The catch-up from the table behind the slot finished.
    pub caught_up: bool,
    /// Aggregates the streaming relay handed to the table (a retry or dead letter at their head).
    pub deferred_aggregates: i64,
}

/// The replication slots of `--source wal` this outbox's relays created (none before schema
/// version 5, or without `--source wal`).
pub async fn wal_slots<C: GenericClient + Sync>(client: &C) -> Result<Vec<WalSlot>> {
    let present: bool = client.query_typed_one(WAL_PRESENT, &[]).await?.get(0);
    if !present {
        return Ok(Vec::new());
    }
    let rows = client.query_typed(WAL_SLOTS, &[]).await?;
    Ok(rows
        .iter()
        .map(|r| WalSlot {
            slot_name: r.get("slot_name"),
            present: r.get("present"),
            active: r.get("active"),
            wal_status: r.get("wal_status"),
            retained_bytes: r.get("retained_bytes"),
            unconfirmed_bytes: r.get("unconfirmed_bytes"),
            caught_up: r.get("caught_up"),
            deferred_aggregates: r.get("deferred_aggregates"),
        })
        .collect())
}

/// An aggregate whose later events wait behind a dead letter: what an operator needs to act on it
/// (`dead-letters retry` or `discard` with `event_id`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BlockedAggregate {
    /// The blocked aggregate's type.
    pub aggregate_type: String,
    /// The blocked aggregate's id.
    pub aggregate_id: String,
    /// The dead letter at the aggregate's head.
    pub event_id: Uuid,
    /// The dead letter's event type.
    pub event_type: String,
    /// Why its last publish failed.
    pub last_error: Option<String>,
    /// When it was dead-lettered.
    pub dead_lettered_at: Timestamp,
    /// Pending events of the aggregate behind it.
    pub waiting_events: i64,
}

/// Up to `limit` blocked aggregates, oldest dead letter first.
pub async fn blocked_aggregates<C: GenericClient + Sync>(
    client: &C,
    limit: i64,
) -> Result<Vec<BlockedAggregate>> {
    let rows = client
        .query_typed(BLOCKED_AGGREGATES, &[(&limit, Type::INT8)])
        .await?;
    rows.iter()
        .map(|r| {
            Ok(BlockedAggregate {
                aggregate_type: r.try_get("aggregate_type")?,
                aggregate_id: r.try_get("aggregate_id")?,
                event_id: r.try_get("event_id")?,
                event_type: r.try_get("event_type")?,
                last_error: r.try_get("last_error")?,
                dead_lettered_at: r.try_get("dead_lettered_at")?,
                waiting_events: r.try_get("waiting_events")?,
            })
        })
        .collect()
}

/// One row of `outbox_dead_letters`.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// The event's id (what `dead-letters retry|discard` take).
    pub id: Uuid,
    /// Its place in its aggregate's order.
    pub seq: i64,
    /// Its aggregate's type.
    pub aggregate_type: String,
    /// Its aggregate's id.
    pub aggregate_id: String,
    /// Its event type.
    pub event_type: String,
    /// Attempts spent.
    pub attempts: i32,
    /// Why its last publish failed.
    pub last_error: Option<String>,
    /// Any value a row can hold (`-infinity`, dates before 1970): printed, never a panic.
    pub created_at: Timestamp,
    /// When it was dead-lettered.
    pub dead_lettered_at: Timestamp,
    /// The payload as JSON text.
    pub payload: String,
}

/// Up to `limit` dead letters (of `event_type`, if given), oldest first.
pub async fn dead_letters<C: GenericClient + Sync>(
    client: &C,
    limit: i64,
    event_type: Option<&str>,
) -> Result<Vec<DeadLetter>> {
    let rows = client
        .query_typed(
            DEAD_LETTERS_LIST,
            &[(&limit, Type::INT8), (&event_type, Type::TEXT)],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(DeadLetter {
                id: r.try_get("id")?,
                seq: r.try_get("seq")?,
                aggregate_type: r.try_get("aggregate_type")?,
                aggregate_id: r.try_get("aggregate_id")?,
                event_type: r.try_get("event_type")?,
                attempts: r.try_get("attempts")?,
                last_error: r.try_get("last_error")?,
                created_at: r.try_get("created_at")?,
                dead_lettered_at: r.try_get("dead_lettered_at")?,
                payload: r.try_get("payload")?,
            })
        })
        .collect()
}

/// [`status`] of the outbox in `schema` (`None`: the connection's search_path), in a transaction
/// of its own after checking the schema version (see the module documentation).
pub async fn status_in(client: &mut Client, schema: Option<&str>) -> Result<Status> {
    let tx = checked_transaction_in(client, schema).await?;
    let status = status(&tx).await?;
    tx.commit().await?;
    Ok(status)
}

/// [`dead_letters`] of the outbox in `schema`, in a transaction of its own after checking the
/// schema version (see the module documentation).
pub async fn dead_letters_in(
    client: &mut Client,
    schema: Option<&str>,
    limit: i64,
    event_type: Option<&str>,
) -> Result<Vec<DeadLetter>> {
    let tx = checked_transaction_in(client, schema).await?;
    let rows = dead_letters(&tx, limit, event_type).await?;
    tx.commit().await?;
    Ok(rows)
}

/// Gives the named dead letters (all of them with `None`) a fresh set of attempts. Fails, changing
/// nothing, when an id is not a dead letter.
pub async fn retry_dead_letters(
    client: &mut tokio_postgres::Client,
    ids: Option<&[Uuid]>,
) -> Result<Vec<Uuid>> {
    let tx = client.transaction().await?;
    change_dead_letters(tx, DEAD_LETTERS_RETRY, ids).await
}

/// [`retry_dead_letters`] in `schema`, after checking the schema version, all in one transaction
/// (see the module documentation).
pub async fn retry_dead_letters_in(
    client: &mut Client,
    schema: Option<&str>,
    ids: Option<&[Uuid]>,
) -> Result<Vec<Uuid>> {
    let tx = checked_transaction_in(client, schema).await?;
    change_dead_letters(tx, DEAD_LETTERS_RETRY, ids).await
}

/// Marks the named dead letters discarded (kept for the audit trail, no longer blocking their
/// aggregate). Fails, changing nothing, when an id is not a dead letter.
pub async fn discard_dead_letters(
    client: &mut tokio_postgres::Client,
    ids: &[Uuid],
) -> Result<Vec<Uuid>> {
    let tx = client.transaction().await?;
    change_dead_letters(tx, DEAD_LETTERS_DISCARD, Some(ids)).await
}

/// [`discard_dead_letters`] in `schema`, after checking the schema version, all in one
/// transaction (see the module documentation).
pub async fn discard_dead_letters_in(
    client: &mut Client,
    schema: Option<&str>,
    ids: &[Uuid],
) -> Result<Vec<Uuid>> {
    let tx = checked_transaction_in(client, schema).await?;
    change_dead_letters(tx, DEAD_LETTERS_DISCARD, Some(ids)).await
}

/// Runs `sql` on `tx` and commits, or rolls back when an id in `ids` was not changed.
async fn change_dead_letters(
    tx: Transaction<'_>,
    sql: &str,
    ids: Option<&[Uuid]>,
) -> Result<Vec<Uuid>> {
    let ids_param: Option<Vec<Uuid>> = ids.map(<[Uuid]>::to_vec);
    let changed: Vec<Uuid> = tx
        .query_typed(sql, &[(&ids_param, Type::UUID_ARRAY)])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if let Some(err) = ids.and_then(|wanted| missing_dead_letters(wanted, &changed)) {
        tx.rollback().await?;
        return Err(err);
    }
    if !changed.is_empty() {
        // Wake the relays: these rows are claimable now (or released their aggregate).
        tx.batch_execute(WAKE).await?;
    }
    tx.commit().await?;
    Ok(changed)
}

/// The not-found error naming the ids of `wanted` that are not in `found`, if any.
fn missing_dead_letters(wanted: &[Uuid], found: &[Uuid]) -> Option<Error> {
    let missing: Vec<String> = wanted
        .iter()
        .filter(|id| !found.contains(id))
        .map(Uuid::to_string)
        .collect();
    (!missing.is_empty()).then(|| {
        Error::not_found(format!(
            "not a dead letter (unknown id, or already published or discarded): {}",
            missing.join(", ")
        ))
    })
}

/// A dead letter that `dead-letters retry` would give a fresh set of attempts
/// ([`retry_preview_in`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RetryCandidate {
    /// The event's id.
    pub id: Uuid,
    /// Its aggregate's type.
    pub aggregate_type: String,
    /// Its aggregate's id.
    pub aggregate_id: String,
    /// Its event type.
    pub event_type: String,
}

/// What [`retry_dead_letters_in`] would retry, in `seq` order, changing nothing (`--dry-run`).
/// Fails like the retry itself when an id is not a dead letter.
pub async fn retry_preview_in(
    client: &mut Client,
    schema: Option<&str>,
    ids: Option<&[Uuid]>,
) -> Result<Vec<RetryCandidate>> {
    let tx = checked_transaction_in(client, schema).await?;
    let ids_param: Option<Vec<Uuid>> = ids.map(<[Uuid]>::to_vec);
    let rows = tx
        .query_typed(
            DEAD_LETTERS_RETRY_PREVIEW,
            &[(&ids_param, Type::UUID_ARRAY)],
        )
        .await?;
    tx.commit().await?;
    let candidates = rows
        .iter()
        .map(|r| {
            Ok(RetryCandidate {
                id: r.try_get("id")?,
                aggregate_type: r.try_get("aggregate_type")?,
                aggregate_id: r.try_get("aggregate_id")?,
                event_type: r.try_get("event_type")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if let Some(wanted) = ids {
        let found: Vec<Uuid> = candidates.iter().map(|c| c.id).collect();
        if let Some(err) = missing_dead_letters(wanted, &found) {
            return Err(err);
        }
    }
    Ok(candidates)
}

/// How far a batched operator command ([`cleanup_table_in`],
/// [`retry_all_dead_letters_in`]) has come: reported after each committed batch, so that a
/// caller can show progress (the CLI draws it on a terminal). Everything counted is committed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// Rows changed (deleted, retried) so far.
    pub rows: u64,
    /// Batches committed so far.
    pub batches: u64,
}

impl Progress {
    fn add_batch(&mut self, rows: u64) {
        self.rows += rows;
        self.batches += 1;
    }
}

/// Gives every dead letter a fresh set of attempts, `batch_size` of them per transaction (each
/// wakes the relays when it commits), in `seq` order; `on_batch` hears after each commit.
/// Returns the number retried.
///
/// Unlike [`retry_dead_letters_in`] with ids this is not one transaction: a failure keeps the
/// batches committed before it (reported to `on_batch`), and running it again retries the rest.
/// Each dead letter present at the start is retried at most once, even if a relay dead-letters it
/// again while the command runs; later dead letters may be included.
pub async fn retry_all_dead_letters_in(
    client: &mut Client,
    schema: Option<&str>,
    batch_size: i64,
    mut on_batch: impl FnMut(Progress),
) -> Result<u64> {
    check_batch_size(batch_size)?;
    let mut progress = Progress::default();
    let mut after_seq = i64::MIN;
    loop {
        let tx = if progress.batches == 0 {
            checked_transaction_in(client, schema).await?
        } else {
            transaction_in(client, schema).await?
        };
        let seqs: Vec<i64> = tx
            .query_typed(
                DEAD_LETTERS_RETRY_BATCH,
                &[(&after_seq, Type::INT8), (&batch_size, Type::INT8)],
            )
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<std::result::Result<_, _>>()?;
        if !seqs.is_empty() {
            // Wake the relays: these rows are claimable now.
            tx.batch_execute(WAKE).await?;
        }
        tx.commit().await?;
        let n = seqs.len() as u64;
        after_seq = seqs.iter().copied().max().unwrap_or(after_seq);
        if n > 0 {
            progress.add_batch(n);
            on_batch(progress);
        }
        if n < batch_size as u64 {
            return Ok(progress.rows);
        }
    }
}

/// A table the retention commands delete old rows from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retained {
    /// `outbox_events`: rows processed (or discarded) before the cutoff. Pending rows and dead
    /// letters stay.
    OutboxEvents,
    /// `processed_events`, the idempotency records of [`crate::process_once`]: ids recorded
    /// before the cutoff. A consumer handles a redelivery of such an event as a first delivery,
    /// so the cutoff must be older than any redelivery can come (the stream's retention,
    /// replays). Fast with the index of schema version 4 (`processed_at`); works without it,
    /// scanning.
    ProcessedEvents,
}

impl Retained {
    /// The table's name (the `table` label of `outbox_retention_deleted_rows`).
    pub fn table(self) -> &'static str {
        match self {
            Retained::OutboxEvents => "outbox_events",
            Retained::ProcessedEvents => "processed_events",
        }
    }

    /// The bounded delete: `$1` the age of the cutoff in microseconds (`int8`, see [`age_micros`]),
    /// `$2` the row limit (`int8`).
    fn delete_sql(self) -> &'static str {
        match self {
            Retained::OutboxEvents => CLEANUP,
            Retained::ProcessedEvents => CLEANUP_PROCESSED_EVENTS,
        }
    }

    /// How many rows the delete would take: `$1` as for the delete.
    fn count_sql(self) -> &'static str {
        match self {
            Retained::OutboxEvents => CLEANUP_COUNT,
            Retained::ProcessedEvents => CLEANUP_PROCESSED_EVENTS_COUNT,
        }
    }
}

/// Deletes rows processed (or discarded) more than `older_than` ago by the database's clock,
/// `batch_size` rows per statement, each its own short transaction. Returns the number of rows
/// deleted.
pub async fn cleanup<C: GenericClient + Sync>(
    client: &C,
    older_than: Duration,
    batch_size: i64,
) -> Result<u64> {
    cleanup_table(client, Retained::OutboxEvents, older_than, batch_size).await
}

/// Deletes the rows of `table` older than `older_than` (see [`Retained`]), `batch_size` rows per
/// statement, until a statement deletes fewer. Returns the number of rows deleted.
///
/// The cutoff is `now() - older_than` computed by PostgreSQL in each statement, never from this
/// machine's clock, which may be off: the times compared with it are the database's.
pub async fn cleanup_table<C: GenericClient + Sync>(
    client: &C,
    table: Retained,
    older_than: Duration,
    batch_size: i64,
) -> Result<u64> {
    check_batch_size(batch_size)?;
    let age = age_micros(older_than);
    let mut total = 0;
    loop {
        let n = cleanup_step(client, table, age, batch_size).await?;
        total += n;
        if n < batch_size as u64 {
            return Ok(total);
        }
    }
}

/// [`cleanup`] in `schema`: the schema version is checked in the first transaction, and each
/// batch is a transaction of its own that sets the search_path first (see the module
/// documentation).
pub async fn cleanup_in(
    client: &mut Client,
    schema: Option<&str>,
    older_than: Duration,
    batch_size: i64,
) -> Result<u64> {
    cleanup_table_in(
        client,
        schema,
        Retained::OutboxEvents,
        older_than,
        batch_size,
        |_| {},
    )
    .await
}

/// [`cleanup_table`] in `schema` as [`cleanup_in`] runs it, telling `on_batch` after each
/// committed batch (for progress output and counting). On an error the batches reported so far
/// stay deleted.
pub async fn cleanup_table_in(
    client: &mut Client,
    schema: Option<&str>,
    table: Retained,
    older_than: Duration,
    batch_size: i64,
    mut on_batch: impl FnMut(Progress),
) -> Result<u64> {
    check_batch_size(batch_size)?;
    let age = age_micros(older_than);
    let mut progress = Progress::default();
    loop {
        let tx = if progress.batches == 0 {
            checked_transaction_in(client, schema).await?
        } else {
            transaction_in(client, schema).await?
        };
        let n = cleanup_step(&tx, table, age, batch_size).await?;
        tx.commit().await?;
        if n > 0 {
            progress.add_batch(n);
            on_batch(progress);
        }
        if n < batch_size as u64 {
            return Ok(progress.rows);
        }
    }
}

/// How many rows [`cleanup_table_in`] with the same `table` and `older_than` would delete now,
/// deleting nothing (`cleanup --dry-run`): the same cutoff, by the database's clock.
pub async fn cleanup_count_in(
    client: &mut Client,
    schema: Option<&str>,
    table: Retained,
    older_than: Duration,
) -> Result<u64> {
    let age = age_micros(older_than);
    let tx = checked_transaction_in(client, schema).await?;
    let n: i64 = tx
        .query_typed_one(table.count_sql(), &[(&age, Type::INT8)])
        .await?
        .try_get(0)?;
    tx.commit().await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Batched commands stop at the first batch smaller than `batch_size`: below 1 that would never
/// happen.
fn check_batch_size(batch_size: i64) -> Result<()> {
    if batch_size < 1 {
        return Err(Error::config("batch_size", "must be at least 1"));
    }
    Ok(())
}

/// Ages beyond this reach past the earliest time PostgreSQL can hold (4713 BC) from now: nothing
/// is that old.
const MAX_AGE: Duration = Duration::from_secs(6_000 * 365 * 86_400);

/// `older_than` as the retention statements take it: microseconds for PostgreSQL to subtract from
/// its own `now()` (the cutoff is never computed on this machine's clock); `None` (SQL NULL, no
/// row is that old) beyond [`MAX_AGE`].
fn age_micros(older_than: Duration) -> Option<i64> {
    (older_than <= MAX_AGE).then(|| i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX))
}

async fn cleanup_step<C: GenericClient + Sync>(
    client: &C,
    table: Retained,
    age_micros: Option<i64>,
    batch_size: i64,
) -> Result<u64> {
    Ok(client
        .execute_typed(
            table.delete_sql(),
            &[(&age_micros, Type::INT8), (&batch_size, Type::INT8)],
        )
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_ages_go_to_the_database_in_microseconds() {
        assert_eq!(age_micros(Duration::from_secs(3600)), Some(3_600_000_000));
        assert_eq!(age_micros(Duration::from_micros(1)), Some(1));
        assert_eq!(age_micros(MAX_AGE), i64::try_from(MAX_AGE.as_micros()).ok());
        // Past what PostgreSQL can subtract from now: nothing is that old.
        assert_eq!(age_micros(MAX_AGE + Duration::from_secs(1)), None);
        assert_eq!(age_micros(Duration::MAX), None);
    }
}
