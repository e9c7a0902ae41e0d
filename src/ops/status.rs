//! What `outbox-relay status` reads: the counts, the blocked aggregates, the wal source's slots,
//! each also read by the console and the gauges in a transaction of theirs.

use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use super::Outbox;
use crate::error::Result;
use crate::timestamp::Timestamp;

const STATUS: &str = include_str!("../../sql/queries/ops/status.sql");
const BLOCKED_AGGREGATES: &str = include_str!("../../sql/queries/ops/blocked_aggregates.sql");
const WAL_SLOTS: &str = include_str!("../../sql/queries/ops/wal_slots.sql");

impl Outbox<'_> {
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
