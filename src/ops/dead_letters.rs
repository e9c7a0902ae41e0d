//! The dead letters: listed, retried (named, or all in batches), discarded, the retry previewed.

use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};
use uuid::Uuid;

use super::{check_batch_size, Outbox, Progress};
use crate::error::{Error, Result};
use crate::timestamp::Timestamp;

const DEAD_LETTERS_LIST: &str = include_str!("../../sql/queries/ops/dead_letters_list.sql");
const DEAD_LETTERS_RETRY: &str = include_str!("../../sql/queries/ops/dead_letters_retry.sql");
const DEAD_LETTERS_DISCARD: &str = include_str!("../../sql/queries/ops/dead_letters_discard.sql");
const WAKE: &str = include_str!("../../sql/queries/table/wake.sql");
const DEAD_LETTERS_RETRY_BATCH: &str =
    include_str!("../../sql/queries/ops/dead_letters_retry_batch.sql");
const DEAD_LETTERS_RETRY_PREVIEW: &str =
    include_str!("../../sql/queries/ops/dead_letters_retry_preview.sql");

impl Outbox<'_> {
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
