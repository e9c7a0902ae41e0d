//! Retention: old rows of the outbox and of `processed_events` deleted in bounded batches, or
//! counted (`cleanup --dry-run`), by the database's clock.

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use super::{check_batch_size, Outbox, Progress};
use crate::error::Result;

const CLEANUP: &str = include_str!("../../sql/queries/ops/cleanup.sql");
const CLEANUP_PROCESSED_EVENTS: &str =
    include_str!("../../sql/queries/ops/cleanup_processed_events.sql");
const CLEANUP_COUNT: &str = include_str!("../../sql/queries/ops/cleanup_count.sql");
const CLEANUP_PROCESSED_EVENTS_COUNT: &str =
    include_str!("../../sql/queries/ops/cleanup_processed_events_count.sql");

impl Outbox<'_> {
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
