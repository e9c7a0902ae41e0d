//! Operations on an outbox: migrate, grant, the publication of `--source wal`, status, dead
//! letters, cleanup (of the outbox and of `processed_events`), all through one handle,
//! [`Outbox`]. Shared by the CLI and the relay's own periodic tasks (gauges, `--retention`,
//! `--processed-events-retention`).
//!
//! Every statement is sent as an unnamed statement with its parameter types (one round trip, no
//! named prepared statement left on the server), so these work through a transaction pooler such
//! as PgBouncer in transaction mode.
//!
//! Each operation runs in a transaction of its own (cleanup and the retry of every dead letter:
//! one per batch) that first sets the search_path to the outbox's schema with `SET LOCAL`
//! ([`Schema::set_local_search_path`]); the queue and read commands check the schema version in
//! it too. Nothing of that outlives the transaction, so the server connection goes back to a
//! pooler unchanged, and `--schema` needs no `options` in the connection URL (which PgBouncer
//! refuses).
//!
//! ```no_run
//! # async fn example() -> outbox_relay::Result<()> {
//! use std::time::Duration;
//! use outbox_relay::ops::Outbox;
//! use outbox_relay::Schema;
//!
//! let mut client = outbox_relay::connect("postgres://relay@db:5432/app", "ops").await?;
//! let mut outbox = Outbox::new(&mut client, Schema::optional(Some("billing"))?);
//! let status = outbox.status().await?;
//! println!("{} pending, {} dead letters", status.pending, status.dead_letters);
//! for dead in outbox.dead_letters(20, None).await? {
//!     println!("{} {}: {:?}", dead.id, dead.event_type, dead.last_error);
//! }
//! let retried = outbox.retry_dead_letters(None).await?; // all of them
//! let week = Duration::from_secs(7 * 24 * 3600);
//! let deleted = outbox.cleanup(week, 1000).await?;
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
use crate::migrate::{self, Grantee};
use crate::schema::Schema;
use crate::source::wal::publication::Publication;
use crate::timestamp::Timestamp;

const STATUS: &str = include_str!("../sql/queries/ops/status.sql");
const DEAD_LETTERS_LIST: &str = include_str!("../sql/queries/ops/dead_letters_list.sql");
const DEAD_LETTERS_RETRY: &str = include_str!("../sql/queries/ops/dead_letters_retry.sql");
const DEAD_LETTERS_DISCARD: &str = include_str!("../sql/queries/ops/dead_letters_discard.sql");
const WAKE: &str = include_str!("../sql/queries/table/wake.sql");
const CLEANUP: &str = include_str!("../sql/queries/ops/cleanup.sql");
const CLEANUP_PROCESSED_EVENTS: &str =
    include_str!("../sql/queries/ops/cleanup_processed_events.sql");
const CLEANUP_COUNT: &str = include_str!("../sql/queries/ops/cleanup_count.sql");
const CLEANUP_PROCESSED_EVENTS_COUNT: &str =
    include_str!("../sql/queries/ops/cleanup_processed_events_count.sql");
const DEAD_LETTERS_RETRY_BATCH: &str =
    include_str!("../sql/queries/ops/dead_letters_retry_batch.sql");
const DEAD_LETTERS_RETRY_PREVIEW: &str =
    include_str!("../sql/queries/ops/dead_letters_retry_preview.sql");
const BLOCKED_AGGREGATES: &str = include_str!("../sql/queries/ops/blocked_aggregates.sql");
const WAL_SLOTS: &str = include_str!("../sql/queries/ops/wal_slots.sql");
const CATCH_UP_AGAIN: &str = include_str!("../sql/queries/wal/wal_catch_up_again.sql");

/// The operations on one outbox: a connection and the outbox's schema (`None`: the connection's
/// own search_path). Each method runs in a transaction of its own (see the module
/// documentation); the queue and read commands first check that the schema is there and current
/// (an error naming `outbox-relay migrate` otherwise), `migrate`, `applied`, `grant` and the
/// publication's setup do not.
#[derive(Debug)]
pub struct Outbox<'c> {
    client: &'c mut Client,
    schema: Option<Schema>,
}

impl<'c> Outbox<'c> {
    /// The outbox in `schema` on `client`.
    pub fn new(client: &'c mut Client, schema: Option<Schema>) -> Self {
        Outbox { client, schema }
    }

    /// The outbox's schema (`None`: the connection's search_path).
    pub fn schema(&self) -> Option<&Schema> {
        self.schema.as_ref()
    }

    /// A transaction whose statements find the outbox objects in the schema: it starts with
    /// `SET LOCAL search_path`, which ends with the transaction (commit or rollback), so no
    /// session state is left on the connection. Without a schema, a plain transaction.
    async fn transaction(&mut self) -> Result<Transaction<'_>> {
        let tx = self.client.transaction().await?;
        if let Some(schema) = &self.schema {
            tx.batch_execute(&schema.set_local_search_path()).await?;
        }
        Ok(tx)
    }

    /// [`Outbox::transaction`], after checking in it that the schema is there and current.
    pub(crate) async fn checked_transaction(&mut self) -> Result<Transaction<'_>> {
        let tx = self.transaction().await?;
        migrate::check_schema(&tx).await?;
        Ok(tx)
    }

    /// Fails with a message telling the user to run `outbox-relay migrate` when the schema is
    /// missing or older than this build needs ([`migrate::REQUIRED_VERSION`]).
    pub async fn check(&mut self) -> Result<()> {
        self.checked_transaction().await?.commit().await?;
        Ok(())
    }

    /// What `outbox-relay status` counts.
    pub async fn status(&mut self) -> Result<Status> {
        let tx = self.checked_transaction().await?;
        let status = read_status(&tx, None).await?;
        tx.commit().await?;
        Ok(status)
    }

    /// The replication slots of `--source wal` this outbox's relays created (none without
    /// `--source wal`).
    pub async fn wal_slots(&mut self) -> Result<Vec<WalSlot>> {
        let tx = self.checked_transaction().await?;
        let slots = read_wal_slots(&tx).await?;
        tx.commit().await?;
        Ok(slots)
    }

    /// Up to `limit` blocked aggregates, oldest dead letter first.
    pub async fn blocked_aggregates(&mut self, limit: i64) -> Result<Vec<BlockedAggregate>> {
        let tx = self.checked_transaction().await?;
        let blocked = read_blocked_aggregates(&tx, limit).await?;
        tx.commit().await?;
        Ok(blocked)
    }

    /// [`Outbox::status`], up to `limit` [`Outbox::blocked_aggregates`] and the
    /// [`Outbox::wal_slots`], read in one transaction (one schema check, one snapshot of the
    /// counts and the list): what `outbox-relay status` shows.
    pub async fn overview(&mut self, limit: i64) -> Result<Overview> {
        let tx = self.checked_transaction().await?;
        let status = read_status(&tx, None).await?;
        let blocked = read_blocked_aggregates(&tx, limit).await?;
        let wal_slots = read_wal_slots(&tx).await?;
        tx.commit().await?;
        Ok(Overview {
            status,
            blocked,
            wal_slots,
        })
    }

    /// Up to `limit` dead letters (of `event_type`, if given), oldest first.
    pub async fn dead_letters(
        &mut self,
        limit: i64,
        event_type: Option<&str>,
    ) -> Result<Vec<DeadLetter>> {
        let tx = self.checked_transaction().await?;
        let rows = read_dead_letters(&tx, limit, event_type).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// Gives the named dead letters (all of them with `None`) a fresh set of attempts, in one
    /// transaction. Fails, changing nothing, when an id is not a dead letter.
    pub async fn retry_dead_letters(&mut self, ids: Option<&[Uuid]>) -> Result<Vec<Uuid>> {
        let tx = self.checked_transaction().await?;
        change_dead_letters(tx, DEAD_LETTERS_RETRY, ids).await
    }

    /// Marks the named dead letters discarded (kept for the audit trail, no longer blocking their
    /// aggregate), in one transaction. Fails, changing nothing, when an id is not a dead letter.
    pub async fn discard_dead_letters(&mut self, ids: &[Uuid]) -> Result<Vec<Uuid>> {
        let tx = self.checked_transaction().await?;
        change_dead_letters(tx, DEAD_LETTERS_DISCARD, Some(ids)).await
    }

    /// What [`Outbox::retry_dead_letters`] would retry, in `seq` order, changing nothing
    /// (`--dry-run`). Fails like the retry itself when an id is not a dead letter.
    pub async fn retry_preview(&mut self, ids: Option<&[Uuid]>) -> Result<Vec<RetryCandidate>> {
        let tx = self.checked_transaction().await?;
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

    /// Gives every dead letter a fresh set of attempts, `batch_size` of them per transaction (each
    /// wakes the relays when it commits), in `seq` order; `on_batch` hears after each commit.
    /// Returns the number retried. The schema version is checked in the first transaction.
    ///
    /// Unlike [`Outbox::retry_dead_letters`] this is not one transaction: a failure keeps the
    /// batches committed before it (reported to `on_batch`), and running it again retries the
    /// rest. Each dead letter present at the start is retried at most once, even if a relay
    /// dead-letters it again while the command runs; later dead letters may be included.
    pub async fn retry_all_dead_letters(
        &mut self,
        batch_size: i64,
        mut on_batch: impl FnMut(Progress),
    ) -> Result<u64> {
        check_batch_size(batch_size)?;
        let mut progress = Progress::default();
        let mut after_seq = i64::MIN;
        loop {
            let tx = if progress.batches == 0 {
                self.checked_transaction().await?
            } else {
                self.transaction().await?
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

    /// Deletes outbox rows processed (or discarded) more than `older_than` ago by the database's
    /// clock, as [`Outbox::cleanup_table`] does. Returns the number of rows deleted.
    pub async fn cleanup(&mut self, older_than: Duration, batch_size: i64) -> Result<u64> {
        self.cleanup_table(Retained::OutboxEvents, older_than, batch_size, |_| {})
            .await
    }

    /// Deletes the rows of `table` older than `older_than` (see [`Retained`]), `batch_size` rows
    /// per transaction, until a batch deletes fewer; `on_batch` hears after each committed batch
    /// (for progress output and counting). The schema version is checked in the first
    /// transaction. On an error the batches reported so far stay deleted. Returns the number of
    /// rows deleted.
    ///
    /// The cutoff is `now() - older_than` computed by PostgreSQL in each statement, never from
    /// this machine's clock, which may be off: the times compared with it are the database's.
    pub async fn cleanup_table(
        &mut self,
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
                self.checked_transaction().await?
            } else {
                self.transaction().await?
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

    /// How many rows [`Outbox::cleanup_table`] with the same `table` and `older_than` would
    /// delete now, deleting nothing (`cleanup --dry-run`): the same cutoff, by the database's
    /// clock.
    pub async fn cleanup_count(&mut self, table: Retained, older_than: Duration) -> Result<u64> {
        let age = age_micros(older_than);
        let tx = self.checked_transaction().await?;
        let n: i64 = tx
            .query_typed_one(table.count_sql(), &[(&age, Type::INT8)])
            .await?
            .try_get(0)?;
        tx.commit().await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Applies the missing migrations in one transaction, under an advisory lock so that two
    /// `migrate` runs at once apply each version once; with a schema, creates it first when it
    /// is missing. Returns the versions applied now (empty: up to date).
    ///
    /// ```no_run
    /// # async fn example() -> outbox_relay::Result<()> {
    /// use outbox_relay::migrate;
    /// use outbox_relay::ops::Outbox;
    ///
    /// let mut client = outbox_relay::connect("postgres://admin@db:5432/app", "app-migrate").await?;
    /// let mut outbox = Outbox::new(&mut client, None);
    /// let applied = outbox.migrate().await?;
    /// println!("applied {applied:?}; schema version {}", migrate::current_version());
    ///
    /// // Or, where the schema is applied by another tool, only check it (a deploy gate):
    /// let applied = outbox.applied().await?;
    /// migrate::require_applied(&applied)?; // an error naming `outbox-relay migrate` if behind
    /// # Ok(())
    /// # }
    /// ```
    pub async fn migrate(&mut self) -> Result<Vec<i32>> {
        let schema = self.schema.clone();
        let tx = self.transaction().await?;
        let applied = migrate::apply(&tx, schema.as_ref()).await?;
        tx.commit().await?;
        Ok(applied)
    }

    /// The schema versions applied, oldest first; empty when the outbox schema does not exist
    /// yet (see [`migrate::require_applied`], [`migrate::pending`]).
    pub async fn applied(&mut self) -> Result<Vec<i32>> {
        let tx = self.transaction().await?;
        let versions = migrate::applied_if_any(&tx).await?;
        tx.commit().await?;
        Ok(versions)
    }

    /// Grants `role` the least privileges its job needs on the outbox's objects.
    pub async fn grant(&mut self, role: &str, grantee: Grantee) -> Result<()> {
        let tx = self.transaction().await?;
        migrate::grant(&tx, role, grantee).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Creates the publication `--source wal` streams from (`migrate --wal`), unless it exists,
    /// and repairs one that does not publish every insert into the outbox's table (see
    /// [`Outbox::ensure_publication`]). Returns its name and whether it was created now.
    pub async fn create_publication(&mut self) -> Result<(String, bool)> {
        let setup = self.ensure_publication().await?;
        Ok((setup.name, setup.created))
    }

    /// Makes the publication `--source wal` streams from publish every insert into the outbox's
    /// table: creates it, or repairs one changed by hand (adds the table back, gives `publish`
    /// its inserts, drops a row filter or column list; one `FOR ALL TABLES` stays so). After a
    /// repair the outbox's slots catch up from the table before they stream, since the rows
    /// written meanwhile are in no stream. Fails naming what is wrong when it cannot repair it.
    pub async fn ensure_publication(&mut self) -> Result<PublicationSetup> {
        let tx = self.transaction().await?;
        tx.batch_execute(migrate::LOCK).await?;
        let found = Publication::read(&tx).await?;
        let problem = found.problem();
        for stmt in found.repair() {
            if let Err(e) = tx.batch_execute(stmt).await {
                return Err(Error::replication(
                    format!(
                        "{}; repairing it failed ({stmt})",
                        problem.as_deref().unwrap_or("publication")
                    ),
                    false,
                )
                .caused_by(e));
            }
        }
        if problem.is_some() {
            if let Some(still) = Publication::read(&tx).await?.problem() {
                return Err(Error::replication(
                    format!("{still} after `migrate --wal` repaired it: fix it by hand"),
                    false,
                ));
            }
        }
        let repaired = found.flaws_described().filter(|_| found.exists);
        if repaired.is_some() {
            tx.execute_typed(CATCH_UP_AGAIN, &[(&None::<&str>, Type::TEXT)])
                .await?;
        }
        tx.commit().await?;
        Ok(PublicationSetup {
            name: found.name,
            created: !found.exists,
            repaired,
        })
    }
}

/// What `outbox-relay status` shows ([`Outbox::overview`]); as JSON (`status --json`) the
/// status's fields, then `blocked` and `wal_slots`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct Overview {
    /// The counts.
    #[serde(flatten)]
    pub status: Status,
    /// Up to the limit asked for of the blocked aggregates, oldest dead letter first.
    pub blocked: Vec<BlockedAggregate>,
    /// The replication slots of `--source wal`.
    pub wal_slots: Vec<WalSlot>,
}

/// What [`Outbox::ensure_publication`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublicationSetup {
    /// The publication's name (`outbox_wal_publication()`).
    pub name: String,
    /// It did not exist: created now.
    pub created: bool,
    /// It existed but did not publish every insert into the outbox's table (changed by hand):
    /// what was wrong, repaired now.
    pub repaired: Option<String>,
}

/// What `outbox-relay status` reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
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

/// The status of the outbox in the connection's current search_path, its blocked aggregates
/// counted up to `blocked_up_to` (`None`: all of them).
pub(crate) async fn read_status<C: GenericClient + Sync>(
    client: &C,
    blocked_up_to: Option<i64>,
) -> Result<Status> {
    let row = client
        .query_typed_one(STATUS, &[(&blocked_up_to, Type::INT8)])
        .await?;
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
#[non_exhaustive]
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

/// The replication slots of `--source wal` this outbox's relays created (none without
/// `--source wal`).
pub(crate) async fn read_wal_slots<C: GenericClient + Sync>(client: &C) -> Result<Vec<WalSlot>> {
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
#[non_exhaustive]
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
pub(crate) async fn read_blocked_aggregates<C: GenericClient + Sync>(
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
#[non_exhaustive]
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
async fn read_dead_letters<C: GenericClient + Sync>(
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
/// ([`Outbox::retry_preview`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
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

/// How far a batched operator command ([`Outbox::cleanup_table`],
/// [`Outbox::retry_all_dead_letters`]) has come: reported after each committed batch, so that a
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
    /// replays). Found through the index of schema version 4 (`processed_at`).
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
