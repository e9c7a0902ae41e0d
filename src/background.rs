//! Periodic side tasks of the relay: gauges from a cheap status query, and the `--retention` and
//! `--processed-events-retention` cleanups.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::ops::{self, Progress, Retained};

/// Refreshes the pending / oldest-age / dead-letter gauges every `stats_interval` (not per batch:
/// the count is a scan of the pending index) and records whether the database answers.
pub(crate) async fn stats(
    config: RelayConfig,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let mut client = None;
    let mut tick = tokio::time::interval(config.stats_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if client
            .as_ref()
            .is_none_or(|c: &tokio_postgres::Client| c.is_closed())
        {
            client = crate::db::connect(&config.database_url, "outbox-relay-stats")
                .await
                .ok();
        }
        let Some(c) = client.as_mut() else {
            health.set_database(false);
            continue;
        };
        let status = crate::ops::status_in(c, config.schema.as_deref());
        match tokio::time::timeout(Duration::from_secs(5), status).await {
            Ok(Ok(s)) => {
                health.set_database(true);
                metrics.pending.set(s.pending);
                metrics
                    .oldest_pending_age_seconds
                    .set(s.oldest_pending_age_seconds);
                metrics.dead_letters.set(s.dead_letters);
                if config.source == crate::config::Source::Wal {
                    replication_lag(c, &config.slot(), &metrics).await;
                }
            }
            Ok(Err(e)) => {
                health.set_database(false);
                tracing::warn!(error = %e, "status query failed");
                client = None;
            }
            Err(_) => {
                health.set_database(false);
                client = None;
            }
        }
    }
}

/// The slot's retained WAL into `outbox_replication_lag_bytes` (0 while there is no slot).
async fn replication_lag(client: &tokio_postgres::Client, slot: &str, metrics: &Metrics) {
    match crate::source::wal::control::slot_lag(client, slot).await {
        Ok(lag) => {
            let bytes = lag.unwrap_or(0.0);
            metrics.replication_lag_bytes.set(bytes);
        }
        Err(e) => tracing::warn!(error = %e, "replication slot query failed"),
    }
}

/// Rows deleted per statement by the relay's retention: short transactions and locks while
/// relays and consumers run.
const RETENTION_BATCH: i64 = 1000;

/// Deletes processed outbox rows older than `retention`, and `processed_events` rows older than
/// `processed_events_retention`, in small batches: every tenth of the shorter retention, between
/// once a second and once a minute.
pub(crate) async fn retention(
    config: RelayConfig,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let Some(shortest) = [config.retention, config.processed_events_retention]
        .into_iter()
        .flatten()
        .min()
    else {
        return;
    };
    let period = (shortest / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let schema = config.schema.as_deref();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<tokio_postgres::Client> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // One connection kept between rounds (a new one when it broke).
        if client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            client = match crate::db::connect(&config.database_url, "outbox-relay-cleanup").await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "retention cleanup failed");
                    continue;
                }
            };
        }
        let Some(client) = client.as_mut() else {
            continue;
        };
        let rounds = [
            (Retained::OutboxEvents, config.retention),
            (Retained::ProcessedEvents, config.processed_events_retention),
        ];
        for (table, older_than) in rounds {
            let Some(older_than) = older_than else {
                continue;
            };
            let mut count = counter(&metrics, table.table());
            let deleted = ops::cleanup_table_in(
                client,
                schema,
                table,
                older_than,
                RETENTION_BATCH,
                &mut count,
            )
            .await;
            log(table.table(), deleted);
        }
    }
}

/// Counts the rows of `table` deleted by each committed batch as it commits, so that a round
/// failing part-way still counts what it deleted.
fn counter<'a>(metrics: &'a Metrics, table: &'static str) -> impl FnMut(Progress) + 'a {
    let mut counted = 0;
    move |progress: Progress| {
        metrics.count_retention_deleted(table, progress.rows - counted);
        counted = progress.rows;
    }
}

/// Logs what one retention round of `table` deleted (counted batch by batch by [`counter`]).
fn log(table: &'static str, deleted: crate::error::Result<u64>) {
    match deleted {
        Ok(0) => {}
        Ok(n) => tracing::info!(table, deleted = n, "retention cleanup"),
        Err(e) => tracing::warn!(table, error = %e, "retention cleanup failed"),
    }
}
