//! Periodic side tasks of the relay: gauges from a cheap status query, and `--retention` cleanup.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::health::Health;
use crate::metrics::Metrics;

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

/// Deletes processed rows older than `retention`, in small batches, about once a minute.
pub(crate) async fn retention(
    url: String,
    schema: Option<String>,
    retention: Duration,
    shutdown: CancellationToken,
) {
    let period = (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let result = async {
            let mut client = crate::db::connect(&url, "outbox-relay-cleanup").await?;
            crate::ops::cleanup_in(&mut client, schema.as_deref(), retention, 1000).await
        };
        match result.await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "retention cleanup"),
            Err(e) => tracing::warn!(error = %e, "retention cleanup failed"),
        }
    }
}
