//! The pipelined batches of `--source wal`: each step records batch N (delete, failures,
//! deferral, COMMIT) while batch N+1 publishes and batch N+2 is claimed, on three connections
//! side by side. What to claim, what to publish and how far the slot may confirm is decided by
//! the pure [`Pipeline`]; this loop performs it and reports what happened.

use foldhash::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use backoff::backoff::Backoff;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::control::Control;
use super::fallback::Fallback;
use super::pipeline::{BatchId, Pipeline};
use super::store::WalOpen;
use super::stream::Stream;
use super::sweep::KeptRounds;
use super::{Stop, WalSource};
use crate::error::{Error, Result};
use crate::event::{AggregateKey, OutboxEvent};
use crate::source::batch::{publish_claim, BatchReport, Published};
use crate::stop::{or_stop, pause, Grace};

/// A streamed row not visible yet is claimed again after this pause, doubling while it stays so
/// (up to the cap). PostgreSQL writes a commit record (which the stream sends) a moment before the
/// transaction becomes visible to others; behind a synchronous standby, a network round trip.
const VISIBILITY_RETRY: Duration = Duration::from_millis(1);
const VISIBILITY_RETRY_MAX: Duration = Duration::from_millis(64);

/// A batch claimed on `stores[store]`, not published yet.
struct Claimed {
    batch: BatchId,
    store: usize,
    open: WalOpen,
    events: HashMap<Uuid, OutboxEvent>,
}

/// A batch published and settled on `stores[store]`, its outcome not recorded yet.
struct Finishing {
    batch: BatchId,
    store: usize,
    open: WalOpen,
    published: Published,
    /// The aggregates it defers.
    deferring: Vec<AggregateKey>,
}

/// The batches a step is still busy with, for the word on what a shutdown could not wait for
/// (each the batch's number plus one; 0: none).
#[derive(Default)]
struct Progress {
    recording: AtomicU64,
    publishing: AtomicU64,
    claiming: AtomicU64,
}

impl Progress {
    fn begin(part: &AtomicU64, batch: BatchId) {
        part.store(batch.saturating_add(1), Ordering::Relaxed);
    }

    fn end(part: &AtomicU64) {
        part.store(0, Ordering::Relaxed);
    }

    /// What the step still waits for, in words.
    fn waiting_for(&self) -> String {
        let parts: Vec<String> = [
            (&self.recording, "the database to record batch"),
            (&self.publishing, "the broker to acknowledge batch"),
            (&self.claiming, "the database to claim batch"),
        ]
        .into_iter()
        .filter_map(|(part, what)| {
            let batch = part.load(Ordering::Relaxed);
            (batch > 0).then(|| format!("{what} {}", batch - 1))
        })
        .collect();
        match parts.is_empty() {
            true => "a step of the batches".to_string(),
            false => parts.join(", "),
        }
    }
}

/// What one step did.
#[derive(Default)]
struct Step {
    /// A batch was recorded: its report and the aggregates it deferred.
    recorded: Option<(BatchReport, Vec<AggregateKey>)>,
    published: Option<Finishing>,
    claimed: Option<Claimed>,
    failure: Option<Error>,
}

impl WalSource<'_> {
    /// Streams until shutdown (`Ok`) or trouble. `deferred`: the deferred aggregates.
    pub(super) async fn stream(
        &mut self,
        control: &Control,
        mut stream: Stream,
        deferred: Vec<AggregateKey>,
        shutdown: &CancellationToken,
    ) -> std::result::Result<(), Stop> {
        let mut pipeline = Pipeline::new(deferred);
        // At once: serve what the durable record holds, whoever recorded it.
        let mut sweep_at = Some(Instant::now());
        let mut fallback = Fallback::new(self.source.fallback_interval);
        // A round of the transactions kept for their count runs before a sweep: at once, after a
        // wake-up (a discard completes a transaction) and every fallback interval.
        let mut purge_due = true;
        let mut kept_rounds = KeptRounds::default();
        let mut claimed: Option<Claimed> = None;
        let mut finishing: Option<Finishing> = None;
        // The broker had trouble with part of the last batch published: record it, then pause.
        let mut hold = false;
        let mut carry_wait = VISIBILITY_RETRY;
        // The work in hand after a stop (a step, then the record of what it published) shares
        // one grace.
        let grace = Grace::new(shutdown);
        loop {
            // Between steps too: a stream that never pauses must not keep the relay from stopping.
            if shutdown.is_cancelled() {
                break;
            }
            if control.is_closed() {
                return Err(Stop::Retry(Error::database_state(
                    "the control connection (the leadership) was lost",
                )));
            }
            if fallback.due <= Instant::now() {
                // The kept transactions' round comes with the next sweep, which runs a fallback
                // interval after the last one at the latest.
                purge_due = true;
                let look = self.look_for_stranded(control, &mut pipeline, &mut fallback);
                match grace.within(look).await {
                    None => {
                        self.abandon("the database to look for rows no stream carried")
                            .await;
                        // The look runs on the control connection.
                        self.cancel_control(control).await;
                        stream.stop().await;
                        return Ok(());
                    }
                    Some(Ok(true)) => sweep_at = Some(Instant::now()),
                    Some(Ok(false)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "looking for rows no stream carried failed; looking again in an interval")
                    }
                }
            }
            // A sweep that is due runs once the pipeline is empty: no new rows are taken from the
            // stream meanwhile, so that a stream that never pauses does not keep it waiting.
            let sweep_due = sweep_at.is_some_and(|at| at <= Instant::now());
            if claimed.is_none() && finishing.is_none() {
                if sweep_due && !pipeline.has_fresh() {
                    if std::mem::take(&mut purge_due) {
                        // Side work: it ends the moment the stop comes (its transaction rolls
                        // back, and what it would have deleted is found again).
                        let round = self.purge_kept(&mut kept_rounds);
                        let Some(more) = or_stop(shutdown, round).await else {
                            self.stores[0].table().cancel_and_reset().await;
                            break;
                        };
                        // More to look at: the next round before the next sweep.
                        purge_due = more;
                    }
                    let Some(next) = grace.within(self.sweep(&mut pipeline)).await else {
                        self.abandon("the database to sweep the deferred aggregates")
                            .await;
                        stream.stop().await;
                        return Ok(());
                    };
                    sweep_at = next;
                    confirm(&mut pipeline, &stream);
                    continue;
                }
                if !pipeline.has_fresh() {
                    // Nothing to claim at once: wait for the stream, a sweep, a wake-up or
                    // shutdown; with rows carried (not visible yet), at most a short pause.
                    let carried = pipeline.queued().0 > 0;
                    let wake_at = if carried {
                        Some(Instant::now() + carry_wait)
                    } else {
                        Some(sweep_at.map_or(fallback.due, |s| s.min(fallback.due)))
                    };
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = sleep_until(wake_at.unwrap_or_else(Instant::now).into()), if wake_at.is_some() => {
                            if !carried {
                                continue; // the sweep is due
                            }
                            carry_wait = (carry_wait * 2).min(VISIBILITY_RETRY_MAX);
                        }
                        _ = control.woken() => {
                            // Rows became publishable again (`dead-letters retry` or discard):
                            // the next round serves their aggregates, wherever they stand. A
                            // discard may complete a transaction kept for its count.
                            sweep_at = Some(Instant::now());
                            purge_due = true;
                            continue;
                        }
                        change = stream.next() => match change? {
                            Some(change) => pipeline.stream(change),
                            None => return Err(Stop::Retry(Error::replication(
                                "the server ended the replication stream",
                                true,
                            ))),
                        },
                    }
                }
            }
            if !sweep_due {
                self.fill(&mut pipeline, &mut stream)?;
            }
            let no_claim = hold || (sweep_due && !pipeline.has_fresh());
            // After broker trouble: record what was published, publish nothing new, then pause.
            let kept = if hold { claimed.take() } else { None };
            let progress = Progress::default();
            let step = self.step(
                &mut pipeline,
                finishing.take(),
                claimed.take(),
                no_claim,
                &progress,
            );
            let Some(step) = grace.within(step).await else {
                self.abandon(&progress.waiting_for()).await;
                stream.stop().await;
                return Ok(());
            };
            let pause_after = std::mem::take(&mut hold);
            if let Some((report, deferred)) = step.recorded {
                if !deferred.is_empty() {
                    tracing::info!(
                        aggregates = deferred.len(),
                        "aggregates handed to the table (a failed event, or one not claimed)"
                    );
                    // At once: an aggregate deferred behind a row no stream carried (or moved
                    // to another aggregate) may go now; one behind a dead letter or a row locked
                    // elsewhere costs the sweep a look, which then waits for its due time.
                    sweep_at = Some(Instant::now());
                }
                if report.published > 0 {
                    carry_wait = VISIBILITY_RETRY;
                }
                if report.broker_failures == 0 && step.failure.is_none() {
                    self.trouble.reset();
                }
            }
            if let Some(published) = step.published {
                let report = published.published.report;
                if report.broker_failures > 0 {
                    tracing::warn!(
                        published = report.published,
                        broker_failures = report.broker_failures,
                        "broker trouble during a batch; backing off"
                    );
                    hold = true;
                }
                finishing = Some(published);
            }
            claimed = step.claimed;
            if let Some(kept) = kept {
                if pipeline.is_in_flight(kept.batch) {
                    claimed = Some(kept);
                } else {
                    // Gone with a batch before it that could not be recorded.
                    self.stores[kept.store].reset();
                }
            }
            confirm(&mut pipeline, &stream);
            if let Some(e) = step.failure {
                if !self.batch_failed(control, e, shutdown).await? {
                    break;
                }
            } else if pause_after {
                let delay = self.trouble_delay();
                if !pause(shutdown, delay).await {
                    break;
                }
            }
        }
        // Shutdown: the batch published is recorded (its events went out); one claimed but not
        // published is undone (its rows are pending again); whatever was not confirmed streams
        // again to the next leader.
        if let Some(f) = finishing {
            let (batch, metrics) = (f.batch, self.metrics);
            let store = &mut self.stores[f.store];
            let record = async {
                match store.resume(f.open, f.deferring) {
                    Ok((claim, record)) => f
                        .published
                        .finish_with(claim, metrics, record)
                        .await
                        .map(|_| ()),
                    Err(e) => Err(e),
                }
            };
            // Shutdown came already: the record has what is left of the grace.
            match grace.within(record).await {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "recording the last batch failed; its events go out again")
                }
                None => {
                    self.abandon(&format!("the database to record batch {batch}"))
                        .await
                }
            }
        }
        if let Some(c) = claimed {
            self.stores[c.store].reset();
        }
        stream.stop().await;
        Ok(())
    }

    /// Takes what the stream has ready, up to a batch's worth waiting, without waiting.
    fn fill(&self, pipeline: &mut Pipeline, stream: &mut Stream) -> Result<()> {
        loop {
            let (rows, bytes) = pipeline.queued();
            if self.batch.is_full(rows, bytes) {
                return Ok(());
            }
            match stream.ready()? {
                Some(change) => pipeline.stream(change),
                None => return Ok(()),
            }
        }
    }

    /// One step of the pipeline: records `finishing`, publishes `claimed` and claims the next
    /// batch (unless `no_claim`), side by side; then tells the pipeline what happened.
    async fn step(
        &mut self,
        pipeline: &mut Pipeline,
        finishing: Option<Finishing>,
        claimed: Option<Claimed>,
        no_claim: bool,
        progress: &Progress,
    ) -> Step {
        // What to publish and what to claim is decided before the I/O.
        let publishing = claimed.map(|c| {
            let groups = pipeline.publish(c.batch);
            (c, groups)
        });
        let cut = if no_claim {
            None
        } else {
            pipeline.cut(self.batch.size, self.batch.max_bytes)
        };
        let fin_store = finishing.as_ref().map(|f| f.store);
        let pub_store = publishing.as_ref().map(|(c, _)| c.store);
        let claim_store = (0..self.stores.len())
            .find(|i| Some(*i) != fin_store && Some(*i) != pub_store)
            .unwrap_or(0);
        let (mut fin_s, mut pub_s, mut claim_s) = (None, None, None);
        for (i, s) in self.stores.iter_mut().enumerate() {
            if Some(i) == fin_store {
                fin_s = Some(s);
            } else if Some(i) == pub_store {
                pub_s = Some(s);
            } else if i == claim_store {
                claim_s = Some(s);
            }
        }
        let metrics = self.metrics;
        let (retry, publisher) = (self.retry, &self.publisher);
        // The stream's order, for the rows an atomic completion takes (the pipeline is not changed
        // until the step's I/O is done).
        let order: &Pipeline = pipeline;
        let record = async {
            let (f, store) = (finishing?, fin_s?);
            Progress::begin(&progress.recording, f.batch);
            let result = match store.resume(f.open, f.deferring.clone()) {
                Ok((claim, record)) => f.published.finish_with(claim, metrics, record).await,
                Err(e) => Err(e),
            };
            Progress::end(&progress.recording);
            Some((f.batch, result.map(|report| (report, f.deferring))))
        };
        let publish = async {
            let ((c, groups), store) = (publishing?, pub_s?);
            let Claimed {
                batch,
                store: index,
                mut open,
                mut events,
            } = c;
            Progress::begin(&progress.publishing, batch);
            *open.open.groups_mut() = groups
                .iter()
                .map(|g| g.iter().filter_map(|id| events.remove(id)).collect())
                .collect();
            drop(events);
            let result = async {
                let (mut claim, record) = store.resume(open, Vec::new())?;
                let started = Instant::now();
                match publish_claim(retry, publisher, metrics, &mut claim, started, Some(order))
                    .await
                {
                    Ok(published) => {
                        // Recording needs the ids only: the rows' content goes now, so that no
                        // more than two batches' rows are held at once.
                        let mut open = claim.into_open();
                        *open.groups_mut() = Vec::new();
                        Ok((record.reopen(open), published))
                    }
                    Err(e) => {
                        claim.rollback().await?;
                        Err(e)
                    }
                }
            }
            .await;
            Progress::end(&progress.publishing);
            Some((batch, index, result))
        };
        let claim = async {
            let (mut cut, store) = (cut?, claim_s?);
            Progress::begin(&progress.claiming, cut.batch);
            let result = store.claim_ids(&mut cut.rows).await;
            Progress::end(&progress.claiming);
            Some((cut.batch, result))
        };
        let (recorded, published, claimed) = tokio::join!(record, publish, claim);

        // Tell the pipeline, oldest batch first. A batch that failed takes every later one with
        // it (they go again): their open claims are dropped with their connections.
        let mut step = Step::default();
        let mut failed = false;
        if let Some((batch, result)) = recorded {
            match result {
                Ok(done) => {
                    pipeline.recorded(batch);
                    step.recorded = Some(done);
                }
                Err(e) => {
                    pipeline.failed(batch);
                    step.failure = Some(e);
                    failed = true;
                }
            }
        }
        if let Some((batch, store, result)) = published {
            match result {
                Ok((open, published)) if !failed => {
                    let acked: HashSet<Uuid> = published.acked().iter().copied().collect();
                    let deferring = pipeline.settled(batch, &acked);
                    step.published = Some(Finishing {
                        batch,
                        store,
                        open,
                        published,
                        deferring,
                    });
                }
                result => {
                    if !failed {
                        pipeline.failed(batch);
                        failed = true;
                    }
                    self.stores[store].reset();
                    if let Err(e) = result {
                        step.failure.get_or_insert(e);
                    }
                }
            }
        }
        if let Some((batch, result)) = claimed {
            match result {
                Ok(ids) if !failed => {
                    pipeline.claimed(batch, &ids.found, &ids.moved, &ids.prev, ids.seen_at);
                    step.claimed = Some(Claimed {
                        batch,
                        store: claim_store,
                        open: ids.open,
                        events: ids.events,
                    });
                }
                result => {
                    if !failed {
                        pipeline.failed(batch);
                    }
                    self.stores[claim_store].reset();
                    if let Err(e) = result {
                        step.failure.get_or_insert(e);
                    }
                }
            }
        }
        step
    }

    /// After a batch that failed as a whole: the connections that may be broken are dropped and
    /// the relay backs off. `false`: shutdown came first.
    async fn batch_failed(
        &mut self,
        control: &Control,
        e: Error,
        shutdown: &CancellationToken,
    ) -> std::result::Result<bool, Stop> {
        if control.is_closed() {
            return Err(Stop::Retry(e));
        }
        self.recover(&e);
        let delay = self.trouble_delay();
        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "batch failed; retrying it");
        Ok(pause(shutdown, delay).await)
    }
}

/// Sends the slot the position the pipeline may confirm now, if it moved on.
fn confirm(pipeline: &mut Pipeline, stream: &Stream) {
    if let Some(lsn) = pipeline.confirm() {
        stream.confirm(lsn);
    }
}
