//! Operator queries: status, dead letters, cleanup. Shared by the CLI and the relay's own
//! periodic tasks (gauges, `--retention`).

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::timestamp::Timestamp;

const STATUS: &str = include_str!("../sql/queries/status.sql");
const DEAD_LETTERS_LIST: &str = include_str!("../sql/queries/dead_letters_list.sql");
const DEAD_LETTERS_RETRY: &str = include_str!("../sql/queries/dead_letters_retry.sql");
const DEAD_LETTERS_DISCARD: &str = include_str!("../sql/queries/dead_letters_discard.sql");
const WAKE: &str = include_str!("../sql/queries/wake.sql");
const CLEANUP: &str = include_str!("../sql/queries/cleanup.sql");
const BLOCKED_AGGREGATES: &str = include_str!("../sql/queries/blocked_aggregates.sql");

/// What `outbox-relay status` reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Status {
    /// Not yet published and not dead-lettered.
    pub pending: i64,
    pub oldest_pending_age_seconds: f64,
    /// Failed at least once, waiting for their next try.
    pub waiting_for_retry: i64,
    /// Of those, due now.
    pub due_for_retry: i64,
    pub dead_letters: i64,
    /// Aggregates whose later events wait behind a dead letter.
    pub blocked_aggregates: i64,
}

pub async fn status<C: GenericClient + Sync>(client: &C) -> Result<Status> {
    let row = client.query_one(STATUS, &[]).await?;
    Ok(Status {
        pending: row.get("pending"),
        oldest_pending_age_seconds: row.get("oldest_pending_age_seconds"),
        waiting_for_retry: row.get("waiting_for_retry"),
        due_for_retry: row.get("due_for_retry"),
        dead_letters: row.get("dead_letters"),
        blocked_aggregates: row.get("blocked_aggregates"),
    })
}

/// An aggregate whose later events wait behind a dead letter: what an operator needs to act on it
/// (`dead-letters retry` or `discard` with `event_id`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BlockedAggregate {
    pub aggregate_type: String,
    pub aggregate_id: String,
    /// The dead letter at the aggregate's head.
    pub event_id: Uuid,
    pub event_type: String,
    pub last_error: Option<String>,
    pub dead_lettered_at: Timestamp,
    /// Pending events of the aggregate behind it.
    pub waiting_events: i64,
}

/// Up to `limit` blocked aggregates, oldest dead letter first.
pub async fn blocked_aggregates<C: GenericClient + Sync>(
    client: &C,
    limit: i64,
) -> Result<Vec<BlockedAggregate>> {
    let rows = client.query(BLOCKED_AGGREGATES, &[&limit]).await?;
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
    pub id: Uuid,
    pub seq: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Any value a row can hold (`-infinity`, dates before 1970): printed, never a panic.
    pub created_at: Timestamp,
    pub dead_lettered_at: Timestamp,
    pub payload: String,
}

pub async fn dead_letters<C: GenericClient + Sync>(
    client: &C,
    limit: i64,
    event_type: Option<&str>,
) -> Result<Vec<DeadLetter>> {
    let rows = client
        .query(DEAD_LETTERS_LIST, &[&limit, &event_type])
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

/// Gives the named dead letters (all of them with `None`) a fresh set of attempts. Fails, changing
/// nothing, when an id is not a dead letter.
pub async fn retry_dead_letters(
    client: &mut tokio_postgres::Client,
    ids: Option<&[Uuid]>,
) -> Result<Vec<Uuid>> {
    change_dead_letters(client, DEAD_LETTERS_RETRY, ids).await
}

/// Marks the named dead letters discarded (kept for the audit trail, no longer blocking their
/// aggregate). Fails, changing nothing, when an id is not a dead letter.
pub async fn discard_dead_letters(
    client: &mut tokio_postgres::Client,
    ids: &[Uuid],
) -> Result<Vec<Uuid>> {
    change_dead_letters(client, DEAD_LETTERS_DISCARD, Some(ids)).await
}

async fn change_dead_letters(
    client: &mut tokio_postgres::Client,
    sql: &str,
    ids: Option<&[Uuid]>,
) -> Result<Vec<Uuid>> {
    let tx = client.transaction().await?;
    let ids_param: Option<Vec<Uuid>> = ids.map(<[Uuid]>::to_vec);
    let changed: Vec<Uuid> = tx
        .query(sql, &[&ids_param])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if let Some(wanted) = ids {
        let missing: Vec<String> = wanted
            .iter()
            .filter(|id| !changed.contains(id))
            .map(Uuid::to_string)
            .collect();
        if !missing.is_empty() {
            tx.rollback().await?;
            return Err(Error::NotFound(format!(
                "not a dead letter (unknown id, or already published or discarded): {}",
                missing.join(", ")
            )));
        }
    }
    if !changed.is_empty() {
        // Wake the relays: these rows are claimable now (or released their aggregate).
        tx.batch_execute(WAKE).await?;
    }
    tx.commit().await?;
    Ok(changed)
}

/// Deletes rows processed (or discarded) more than `older_than` ago, `batch_size` rows per
/// statement, each its own short transaction. Returns the number of rows deleted.
pub async fn cleanup<C: GenericClient + Sync>(
    client: &C,
    older_than: Duration,
    batch_size: i64,
) -> Result<u64> {
    let cutoff = SystemTime::now()
        .checked_sub(older_than)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut total = 0;
    loop {
        let n = client.execute(CLEANUP, &[&cutoff, &batch_size]).await?;
        total += n;
        if n < batch_size as u64 {
            return Ok(total);
        }
    }
}
