//! The batch processor: drain, arm, wait, drain.

use std::time::{Duration, Instant};

use backoff::backoff::Backoff;
use backoff::exponential::ExponentialBackoff;
use backoff::SystemClock;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

use crate::config::{BatchConfig, Ordering, RetryConfig, SourceConfig};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::policy::{trouble_backoff, LINGER};
use crate::publisher::Publisher;
use crate::source::batch::{process_batch, BatchReport, Claiming};
use crate::source::store::Store;
use crate::source::table::signals::{Arming, Signals, Wake};
use crate::stop::{pause, within_grace};

pub(crate) struct Processor<'a> {
    pub batch: &'a BatchConfig,
    pub retry: &'a RetryConfig,
    /// Wake-ups: poll every `fallback_interval` even without notifications.
    pub source: &'a SourceConfig,
    pub publisher: Publisher,
    pub signals: &'a Signals,
    pub metrics: &'a Metrics,
    /// Two worker connections: with `Ordering::None`, during a backlog two batches are in flight at
    /// once (the second claims while the first publishes; `SKIP LOCKED` keeps them apart).
    pub stores: [Store; 2],
    /// Pause after a failed batch or the broker's trouble; reset by a batch that went through.
    trouble: ExponentialBackoff<SystemClock>,
    /// The earliest retry time of a failed row: the wait ends then even without a notification.
    next_retry: Option<Instant>,
}

/// What the drain does after a batch.
enum Next {
    /// The batch was full: claim again at once.
    Again,
    /// Claim again after this pause (trouble).
    After(Duration),
    /// The batch found rows but was not full: the drain is probably ending; poll again after
    /// [`LINGER`].
    Linger,
    /// The poll came back empty.
    Idle,
}

impl<'a> Processor<'a> {
    pub fn new(
        (batch, retry, source): (&'a BatchConfig, &'a RetryConfig, &'a SourceConfig),
        publisher: Publisher,
        signals: &'a Signals,
        metrics: &'a Metrics,
        stores: [Store; 2],
    ) -> Self {
        Processor {
            batch,
            retry,
            source,
            publisher,
            signals,
            metrics,
            stores,
            trouble: trouble_backoff(),
            next_retry: None,
        }
    }

    /// Runs until `shutdown`: drain, ask the listener to arm, wait for a wake-up, drain again.
    pub async fn run(&mut self, shutdown: &CancellationToken) -> Result<()> {
        let mut wake = Wake::Reconnect;
        loop {
            if !self.drain(wake, shutdown).await {
                return Ok(());
            }
            self.signals.update_arming(Arming::request);
            match self.wait(shutdown).await {
                Some(reason) => wake = reason,
                None => return Ok(()),
            }
        }
    }

    /// Claims batches until a poll comes back empty (true) or shutdown (false).
    async fn drain(&mut self, mut wake: Wake, shutdown: &CancellationToken) -> bool {
        let mut backlog = false;
        let mut first = true;
        loop {
            if shutdown.is_cancelled() {
                return false;
            }
            self.metrics.wakeup(wake.label());
            // A writer's notification at idle usually brings one event: heads only first. Not at
            // start or on the fallback ticker, where a backlog may wait (in few deep aggregates the
            // walk for heads would visit it twice).
            // The batch in hand is finished after a stop, within the grace: a claim or a record
            // waiting for a lock another session holds must not keep the relay from stopping.
            let Some(result) =
                within_grace(shutdown, self.batch(backlog, wake == Wake::Notify)).await
            else {
                self.abandon().await;
                return false;
            };
            backlog = matches!(result, Ok(r) if r.full);
            let delay = match self.next(result) {
                Next::Idle => return true,
                Next::Again => None,
                Next::After(delay) => Some(delay),
                Next::Linger => {
                    if first {
                        // The wake-up brought a small batch: the drain is probably over. Ask
                        // for arming now, so that the relay is armed by the time it idles (the
                        // first writer that commits meanwhile notifies and disarms it again).
                        self.signals.update_arming(Arming::request);
                    }
                    Some(LINGER)
                }
            };
            if let Some(delay) = delay {
                if !pause(shutdown, delay).await {
                    return false;
                }
            }
            first = false;
            wake = Wake::Backlog;
        }
    }

    /// One batch, or two side by side during a backlog without ordering: with per-aggregate order
    /// the second claim would mostly find the aggregates of the first one locked and scan the
    /// whole backlog for nothing (measured: 2.6x slower at 1,000 aggregates). The first batch
    /// after a writer's notification (`notified`) in per-aggregate order claims heads only: it
    /// usually carries one event, and that claim costs half the full one on the way to the broker.
    async fn batch(&mut self, backlog: bool, notified: bool) -> Result<BatchReport> {
        let [first, second] = &mut self.stores;
        let (batch, retry) = (self.batch, self.retry);
        let (publisher, metrics) = (&self.publisher, self.metrics);
        if notified && batch.ordering == Ordering::Aggregate {
            return process_batch(batch, retry, publisher, metrics, first, Claiming::Heads).await;
        }
        if backlog && batch.ordering == Ordering::None {
            let (a, b) = tokio::join!(
                process_batch(batch, retry, publisher, metrics, first, Claiming::Full),
                process_batch(batch, retry, publisher, metrics, second, Claiming::Full)
            );
            a.and_then(|a| b.map(|b| a.merge(b)))
        } else {
            process_batch(batch, retry, publisher, metrics, first, Claiming::Full).await
        }
    }

    fn next(&mut self, result: Result<BatchReport>) -> Next {
        let report = match result {
            Ok(report) => report,
            Err(e) => {
                let delay = self.trouble_delay();
                self.recover(&e);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "batch failed; backing off");
                return Next::After(delay);
            }
        };
        if let Some(d) = report.next_retry {
            let at = Instant::now() + d;
            self.next_retry = Some(self.next_retry.map_or(at, |n| n.min(at)));
        }
        if report.broker_failures > 0 {
            // Some went through, some met the broker's trouble (their rows are back, no attempt
            // spent): give the broker a moment.
            let delay = self.trouble_delay();
            tracing::warn!(
                published = report.published,
                broker_failures = report.broker_failures,
                retry_in_ms = delay.as_millis() as u64,
                "broker trouble during a batch; backing off"
            );
            return Next::After(delay);
        }
        self.trouble.reset();
        if report.claimed == 0 {
            Next::Idle
        } else if report.full {
            Next::Again
        } else {
            // Rows are still arriving. Poll again shortly instead of arming: arming makes every
            // writer notify (and serialise its commit) until the relay wakes, which under steady
            // load would be most of the time.
            Next::Linger
        }
    }

    fn trouble_delay(&mut self) -> Duration {
        crate::source::recovery::next_delay(&mut self.trouble)
    }

    /// At shutdown, after a batch that did not finish within the grace: its statements are
    /// cancelled and its connections dropped. Its transaction rolls back: the rows stay pending
    /// for the other relays (what it published goes again, and JetStream drops the duplicates).
    async fn abandon(&mut self) {
        tracing::warn!(
            grace_ms = crate::stop::GRACE.as_millis() as u64,
            "stopping without the batch in hand: it was still waiting for the database or the broker after the shutdown's grace; its rows stay pending"
        );
        futures::future::join_all(self.stores.iter_mut().map(Store::cancel_and_reset)).await;
    }

    fn recover(&mut self, e: &Error) {
        crate::source::recovery::recover(&mut self.stores, e);
    }

    /// Waits for a notification, the fallback ticker or a row's retry time; `None` on shutdown.
    async fn wait(&mut self, shutdown: &CancellationToken) -> Option<Wake> {
        let fallback = Instant::now() + self.source.fallback_interval;
        let at = self.next_retry.map_or(fallback, |r| r.min(fallback));
        let wake = tokio::select! {
            _ = shutdown.cancelled() => return None,
            reason = self.signals.woken() => reason,
            _ = sleep_until(at.into()) => {
                if self.next_retry.is_some_and(|n| n <= Instant::now()) {
                    self.next_retry = None;
                }
                Wake::Fallback
            }
        };
        self.signals.update_arming(Arming::busy);
        Some(wake)
    }
}
