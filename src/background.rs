//! Periodic side tasks of the relay: gauges from a cheap status query, and the `--retention` and
//! `--processed-events-retention` cleanups.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::clock::DbClock;
use crate::config::{DatabaseUrl, MetricsConfig, RetentionConfig};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::ops::{self, Outbox, Progress, Retained};
use crate::schema::Schema;
use crate::stop::or_stop;

/// Where the side tasks find the outbox: the worker connections' URL and the validated schema.
#[derive(Clone)]
pub(crate) struct Database {
    pub url: DatabaseUrl,
    pub schema: Option<Schema>,
}

/// Refreshes the pending / oldest-age / dead-letter gauges every `interval` (not per batch: the
/// count is a scan of the pending index), records whether the database answers, and measures the
/// database's clock again (it may drift from this machine's). `slot`: the wal source's, whose lag
/// is measured too.
pub(crate) async fn stats(
    database: Database,
    metrics_config: MetricsConfig,
    slot: Option<String>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    clock: Arc<DbClock>,
    shutdown: CancellationToken,
) {
    let mut client = None;
    let mut future_dated = FirstSeen::default();
    let mut reporter = Reporter::new(slot.clone(), metrics_config.stats_interval);
    let mut tick = tokio::time::interval(metrics_config.stats_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if or_stop(&shutdown, tick.tick()).await.is_none() {
            if let Some(c) = client.as_mut() {
                let mut outbox = Outbox::new(c, database.schema.clone());
                reporter.leave(&mut outbox).await;
            }
            return;
        }
        let round = async {
            if client
                .as_ref()
                .is_none_or(|c: &tokio_postgres::Client| c.is_closed())
            {
                client = crate::db::connect(database.url.expose(), "outbox-relay-stats")
                    .await
                    .ok();
            }
            let Some(c) = client.as_mut() else {
                health.set_database(false);
                return;
            };
            let mut outbox = Outbox::new(c, database.schema.clone());
            match tokio::time::timeout(Duration::from_secs(5), outbox.status()).await {
                Ok(Ok(s)) => {
                    health.set_database(true);
                    metrics.pending.set(s.pending);
                    metrics
                        .oldest_pending_age_seconds
                        .set(future_dated.oldest_age(&s, Instant::now()));
                    metrics.dead_letters.set(s.dead_letters);
                    if let Err(e) = clock.measure(&*c).await {
                        tracing::debug!(error = %e, "reading the database's clock failed");
                    }
                    if let Some(slot) = &slot {
                        replication_lag(c, slot, &metrics).await;
                    }
                    let mut outbox = Outbox::new(c, database.schema.clone());
                    reporter.report(&mut outbox, &metrics).await;
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
        };
        if or_stop(&shutdown, round).await.is_none() {
            // Stopped mid-round (a lock on a table it reads or writes): what it waits in is
            // cancelled and its connection goes; leaving `outbox_relays` waits for nothing more.
            cancel(&database, client.as_ref()).await;
            return;
        }
    }
}

/// After a round cut by the stop: asks the server to cancel what `client` runs, so that neither
/// its statement nor its place in a lock's queue outlives the relay (best effort, bounded).
async fn cancel(database: &Database, client: Option<&tokio_postgres::Client>) {
    let Some(client) = client else {
        return;
    };
    let token = client.cancel_token();
    match crate::stop::last_words(crate::db::cancel(database.url.expose(), &token)).await {
        Some(Ok(())) => {}
        Some(Err(e)) => tracing::debug!(error = %e, "cancelling a side task's statement failed"),
        None => tracing::debug!("cancelling a side task's statement timed out"),
    }
}

const REPORT: &str = include_str!("../sql/queries/relays/report.sql");
const LEAVE: &str = include_str!("../sql/queries/relays/leave.sql");

/// How this relay reports itself in `outbox_relays`, so that the console lists relays, not
/// connections. A failed report is logged and never stops
/// the relay.
struct Reporter {
    id: uuid::Uuid,
    host: String,
    pid: i32,
    source: &'static str,
    slot: Option<String>,
    interval: f64,
    /// A report of this relay was written: a clean stop takes its row away.
    reported: bool,
    /// (when, events published so far) of the reports of the last minute and one before it.
    samples: std::collections::VecDeque<(Instant, u64)>,
}

impl Reporter {
    fn new(slot: Option<String>, interval: Duration) -> Reporter {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown".into());
        Reporter {
            id: uuid::Uuid::new_v4(),
            host,
            pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
            source: if slot.is_some() { "wal" } else { "table" },
            slot,
            interval: interval.as_secs_f64(),
            reported: false,
            samples: std::collections::VecDeque::new(),
        }
    }

    /// Events published in the last minute (since start, in the first one), from the report
    /// made a minute or more ago; `total` and `now` are this report's.
    fn last_minute(&mut self, now: Instant, total: u64) -> u64 {
        self.samples.push_back((now, total));
        let minute = Duration::from_secs(60);
        // Keep one report at least a minute old, and those after it.
        while self.samples.len() > 1
            && self
                .samples
                .get(1)
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= minute)
        {
            self.samples.pop_front();
        }
        let base = self.samples.front().map_or(0, |(at, n)| {
            match now.saturating_duration_since(*at) >= minute {
                true => *n,
                false => 0,
            }
        });
        total.saturating_sub(base)
    }

    async fn report(&mut self, outbox: &mut Outbox<'_>, metrics: &Metrics) {
        let (total, last) = metrics.published_so_far();
        let last_minute = self.last_minute(Instant::now(), total);
        if let Err(e) = self.write(outbox, metrics, total, last, last_minute).await {
            tracing::debug!(error = %e, "reporting this relay in outbox_relays failed");
        }
    }

    async fn write(
        &mut self,
        outbox: &mut Outbox<'_>,
        metrics: &Metrics,
        total: u64,
        last: Option<Duration>,
        last_minute: u64,
    ) -> crate::error::Result<()> {
        let tx = outbox.checked_transaction().await?;
        let slot_lag = self
            .slot
            .as_ref()
            .map(|_| metrics.replication_lag_bytes.get());
        tx.execute(
            REPORT,
            &[
                &self.id,
                &self.host,
                &self.pid,
                &concat!("outbox-relay ", env!("CARGO_PKG_VERSION")),
                &self.source,
                &self.slot,
                &self.interval,
                &last.map(|d| d.as_secs_f64()),
                &i64::try_from(total).unwrap_or(i64::MAX),
                &i64::try_from(last_minute).unwrap_or(i64::MAX),
                &metrics.oldest_pending_age_seconds.get(),
                &slot_lag,
            ],
        )
        .await?;
        tx.commit().await?;
        self.reported = true;
        Ok(())
    }

    /// A clean stop: the row goes (bounded: a stop never waits long on it).
    async fn leave(&mut self, outbox: &mut Outbox<'_>) {
        if !self.reported {
            return;
        }
        let id = self.id;
        let leave = async {
            let tx = outbox.checked_transaction().await?;
            tx.execute(LEAVE, &[&id]).await?;
            tx.commit().await?;
            Ok::<(), crate::error::Error>(())
        };
        match crate::stop::last_words(leave).await {
            Some(Ok(())) => {}
            Some(Err(e)) => tracing::debug!(error = %e, "leaving outbox_relays failed"),
            None => tracing::debug!("leaving outbox_relays timed out"),
        }
    }
}

/// The relay's view of the pending events dated in the future (a writer's clock ahead of the
/// database's, a `created_at` set by SQL). The database gives them age 0, which alone would hide
/// one that is stuck until its date has passed; so the first of them in the queue ages from when
/// this relay first saw it there, on the relay's monotonic clock. Once it is published (or
/// another comes first) the next one starts from 0.
#[derive(Debug, Default)]
struct FirstSeen {
    /// `seq` of the first future-dated pending event, and when it was first seen there.
    first: Option<(i64, Instant)>,
}

impl FirstSeen {
    /// `outbox_oldest_pending_age_seconds` for `status` read at `now`: the database's oldest age,
    /// or the time the first future-dated event has been seen pending, whichever is longer.
    fn oldest_age(&mut self, status: &ops::Status, now: Instant) -> f64 {
        let Some(seq) = status.first_future_dated_seq else {
            self.first = None;
            return status.oldest_pending_age_seconds;
        };
        let since = match self.first {
            Some((seen, since)) if seen == seq => since,
            _ => {
                self.first = Some((seq, now));
                now
            }
        };
        let seen_for = now.saturating_duration_since(since).as_secs_f64();
        status.oldest_pending_age_seconds.max(seen_for)
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

/// Deletes processed outbox rows older than `retention.processed`, and `processed_events` rows
/// older than `retention.processed_events`, in small batches: every tenth of the shorter retention, between
/// once a second and once a minute.
pub(crate) async fn retention(
    database: Database,
    retention: RetentionConfig,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let Some(shortest) = [retention.processed, retention.processed_events]
        .into_iter()
        .flatten()
        .min()
    else {
        return;
    };
    let period = (shortest / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<tokio_postgres::Client> = None;
    loop {
        if or_stop(&shutdown, tick.tick()).await.is_none() {
            return;
        }
        let round = async {
            // One connection kept between rounds (a new one when it broke).
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                client =
                    match crate::db::connect(database.url.expose(), "outbox-relay-cleanup").await {
                        Ok(c) => Some(c),
                        Err(e) => {
                            tracing::warn!(error = %e, "retention cleanup failed");
                            return;
                        }
                    };
            }
            let Some(client) = client.as_mut() else {
                return;
            };
            let mut outbox = Outbox::new(client, database.schema.clone());
            let rounds = [
                (Retained::OutboxEvents, retention.processed),
                (Retained::ProcessedEvents, retention.processed_events),
            ];
            for (table, older_than) in rounds {
                let Some(older_than) = older_than else {
                    continue;
                };
                let mut count = counter(&metrics, table.table());
                let deleted = outbox
                    .cleanup_table(table, older_than, RETENTION_BATCH, &mut count)
                    .await;
                log(table.table(), deleted);
            }
        };
        // Stopped mid-round (a lock on the table it deletes from): the batch in its transaction
        // rolls back with the connection; what it would have deleted waits for the next round.
        if or_stop(&shutdown, round).await.is_none() {
            cancel(&database, client.as_ref()).await;
            return;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn status(oldest: f64, first_future_dated_seq: Option<i64>) -> ops::Status {
        ops::Status {
            pending: 1,
            oldest_pending_age_seconds: oldest,
            waiting_for_retry: 0,
            due_for_retry: 0,
            dead_letters: 0,
            blocked_aggregates: 0,
            future_dated: i64::from(first_future_dated_seq.is_some()),
            max_future_skew_seconds: 0.0,
            first_future_dated_seq,
        }
    }

    #[test]
    fn a_future_dated_event_ages_from_when_it_was_first_seen_first_in_the_queue() {
        let mut seen = FirstSeen::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(seen.oldest_age(&status(3.0, None), at(0)), 3.0);
        // Seen at 10 s: 0 then, 70 s at 80 s (OutboxEventsStuck: > 60 s).
        assert_eq!(seen.oldest_age(&status(0.0, Some(7)), at(10)), 0.0);
        assert_eq!(seen.oldest_age(&status(0.0, Some(7)), at(40)), 30.0);
        assert_eq!(seen.oldest_age(&status(0.0, Some(7)), at(80)), 70.0);
        // An older dated event beside it gives its own age when that is longer.
        assert_eq!(seen.oldest_age(&status(500.0, Some(7)), at(90)), 500.0);
        // Published: the next one starts from 0; none left: the database's figure alone.
        assert_eq!(seen.oldest_age(&status(0.0, Some(9)), at(100)), 0.0);
        assert_eq!(seen.oldest_age(&status(0.0, Some(9)), at(105)), 5.0);
        assert_eq!(seen.oldest_age(&status(1.0, None), at(110)), 1.0);
        assert_eq!(seen.oldest_age(&status(0.0, Some(9)), at(120)), 0.0);
    }

    #[test]
    fn the_last_minute_counts_from_the_report_a_minute_or_more_ago() {
        let mut r = super::Reporter::new(None, Duration::from_secs(5));
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        // In the first minute: everything since start.
        assert_eq!(r.last_minute(at(0), 10), 10);
        assert_eq!(r.last_minute(at(30), 40), 40);
        assert_eq!(r.last_minute(at(55), 100), 100);
        // Then from the latest report at least a minute old.
        assert_eq!(
            r.last_minute(at(60), 110),
            100,
            "since the report at 0 s (10)"
        );
        assert_eq!(
            r.last_minute(at(95), 200),
            160,
            "since the report at 30 s (40)"
        );
        assert_eq!(r.last_minute(at(200), 200), 0, "nothing for a while");
        assert!(r.samples.len() <= 2, "bounded: {:?}", r.samples.len());
    }
}
