//! `--source wal`: lead or stand by; check the slot (creating it, and catching up from the table
//! behind a new one); then stream. Each batch of committed inserts, in commit order, is claimed by
//! id and published, settled and committed like a batch of the table source. An aggregate that
//! cannot go on in commit order (an event failed, or a row was held by another session) is handed
//! to the table (`outbox_wal_deferred`): its events stay pending and a sweep publishes them in seq
//! order until none is left, then the stream takes the aggregate back. The slot's position moves
//! past a transaction only once each of its events is published or pending in the table.

use std::collections::{BTreeSet, HashSet};
use std::ops::Bound;
use std::time::{Duration, Instant};

use backoff::backoff::Backoff;
use backoff::exponential::ExponentialBackoff;
use backoff::SystemClock;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::batch::{process_batch, publish_claim, run_claim, BatchReport, Published};
use super::pause;
use crate::config::RelayConfig;
use crate::error::{Error, Result};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::publisher::Publisher;
use crate::store::wal::{AggregateKey, Candidate, Control};
use crate::store::{OpenClaim, Store};
use crate::wal::{Change, Stream};

/// How often a relay standing by asks for the leadership.
const STANDBY_POLL: Duration = Duration::from_secs(1);

/// Aggregates handed to the table looked at per sweep.
const SWEEP_AGGREGATES: usize = 100;

/// A streamed row not visible yet is claimed again after this pause. PostgreSQL writes a commit
/// record (which the stream sends) a moment before the transaction becomes visible to others.
const VISIBILITY_RETRY: Duration = Duration::from_millis(1);

/// Why leading stopped (shutdown returns `Ok`).
enum Stop {
    /// Setup that waiting cannot heal (wal_level, the publication, the slot's plugin): exit.
    Fatal(Error),
    /// Connections, the slot in use, a lost stream: reconnect after a pause.
    Retry(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        if e.is_retryable() || e.heals_by_waiting() {
            Stop::Retry(e)
        } else {
            Stop::Fatal(e)
        }
    }
}

pub(super) struct WalRelay<'a> {
    pub config: &'a RelayConfig,
    /// The control and replication connections' URL (direct, never pooled; the schema in the
    /// session).
    pub url: &'a str,
    pub publisher: Publisher,
    pub metrics: &'a Metrics,
    pub health: &'a Health,
    /// Three worker connections: one records a batch while the next publishes and the one after
    /// is claimed.
    pub stores: [Store; 3],
    pub slot: String,
    pub trouble: ExponentialBackoff<SystemClock>,
}

/// The stream's state between batches.
#[derive(Default)]
struct Batch {
    candidates: Vec<Candidate>,
    bytes: usize,
    /// Inside a transaction (its inserts may be in this batch, its commit not yet seen).
    in_tx: bool,
    /// The end of the last commit seen: confirmed once the batch holding its events is done.
    last_commit: Option<u64>,
    /// A keepalive's position with nothing in flight: confirmed as well.
    idle: Option<u64>,
}

/// The aggregates handed to the table, and when to sweep them next.
#[derive(Default)]
struct Deferred {
    keys: BTreeSet<AggregateKey>,
    /// Where the last sweep stopped (the next one goes on from there).
    cursor: Option<AggregateKey>,
    sweep_at: Option<Instant>,
}

impl Deferred {
    /// Up to `n` aggregates, going round.
    fn next_round(&mut self, n: usize) -> Vec<AggregateKey> {
        let after = match &self.cursor {
            Some(c) => Bound::Excluded(c.clone()),
            None => Bound::Unbounded,
        };
        let mut round: Vec<AggregateKey> = self
            .keys
            .range((after, Bound::Unbounded))
            .take(n)
            .cloned()
            .collect();
        if round.len() < n {
            let more = n - round.len();
            round.extend(
                self.keys
                    .iter()
                    .take(more)
                    .filter(|k| !round.contains(k))
                    .cloned()
                    .collect::<Vec<_>>(),
            );
        }
        self.cursor = round.last().cloned();
        round
    }

    fn sweep_in(&mut self, delay: Duration) {
        let at = Instant::now() + delay;
        self.sweep_at = Some(self.sweep_at.map_or(at, |s| s.min(at)));
    }
}

impl WalRelay<'_> {
    /// Runs until `shutdown`: leads when no other relay does, stands by otherwise.
    pub async fn run(&mut self, shutdown: &CancellationToken) -> Result<()> {
        let mut standing_by = false;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let stop = match Control::connect(self.url).await {
                Ok(control) => match self
                    .lead_when_free(&control, &mut standing_by, shutdown)
                    .await
                {
                    Ok(()) => return Ok(()),
                    Err(stop) => stop,
                },
                Err(e) => Stop::from(e),
            };
            self.metrics.wal_streaming.set(0);
            match stop {
                Stop::Fatal(e) => return Err(e),
                Stop::Retry(e) => {
                    self.health.set_listener(false);
                    let delay = self.trouble_delay();
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "replication stopped; retrying");
                    if !pause(shutdown, delay).await {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn lead_when_free(
        &mut self,
        control: &Control,
        standing_by: &mut bool,
        shutdown: &CancellationToken,
    ) -> std::result::Result<(), Stop> {
        while !control.try_lead(&self.slot).await? {
            if !*standing_by {
                tracing::info!(slot = %self.slot, "another relay streams from the replication slot; standing by");
                *standing_by = true;
            }
            self.health.set_listener(true);
            if !pause(shutdown, STANDBY_POLL).await {
                return Ok(());
            }
        }
        if *standing_by {
            tracing::info!(slot = %self.slot, "took over the replication slot");
            *standing_by = false;
        }
        self.lead(control, shutdown).await
    }

    /// Holds the leadership: checks the setup and the slot, catches up from the table behind a
    /// new slot, then streams until shutdown (`Ok`) or trouble.
    async fn lead(
        &mut self,
        control: &Control,
        shutdown: &CancellationToken,
    ) -> std::result::Result<(), Stop> {
        let state = control.state(&self.slot).await.map_err(|e| {
            let code = e.as_db_error().and_then(|d| d.code()).map(|c| c.code());
            if matches!(code, Some("42883" | "42P01")) {
                // outbox_wal_publication() or outbox_wal_slots is missing: the schema predates
                // version 5 (undefined_function, undefined_table).
                Stop::Fatal(Error::schema_missing(
                    None,
                    crate::migrate::WAL_REQUIRED_VERSION,
                ))
            } else {
                Stop::from(e)
            }
        })?;
        self.health.set_database(true);
        if state.wal_level != "logical" {
            return Err(Stop::Fatal(Error::replication(
                format!(
                    "--source wal needs wal_level = logical; the server has {} (set it in postgresql.conf and restart PostgreSQL)",
                    state.wal_level
                ),
                false,
            )));
        }
        if !state.publication_exists {
            return Err(Stop::Fatal(Error::replication(
                format!(
                    "publication {} does not exist: run `outbox-relay migrate --wal`",
                    state.publication
                ),
                false,
            )));
        }
        let mut created = false;
        match &state.slot {
            None => {
                control.create_slot(&self.slot).await?;
                tracing::info!(slot = %self.slot, "created the replication slot; catching up from the table first");
                created = true;
            }
            Some(slot) => {
                if let Some(other) = &slot.other_database {
                    return Err(Stop::Fatal(Error::config(
                        "slot_name",
                        format!("replication slot {} belongs to database {other}: choose another --slot-name", self.slot),
                    )));
                }
                if slot.plugin.as_deref() != Some("pgoutput") {
                    return Err(Stop::Fatal(Error::config(
                        "slot_name",
                        format!(
                            "replication slot {} is not a logical slot of pgoutput (plugin {:?}): choose another --slot-name",
                            self.slot, slot.plugin
                        ),
                    )));
                }
                if !slot.caught_up {
                    tracing::info!(slot = %self.slot, "the catch-up from the table behind this slot never finished; catching up first");
                    created = true;
                }
                if slot.wal_status.as_deref() == Some("lost") {
                    tracing::error!(
                        slot = %self.slot,
                        "the replication slot was invalidated (it kept more WAL than max_slot_wal_keep_size allows); dropping it, creating it again and catching up from the table: no event is lost, those written meanwhile go out in seq order"
                    );
                    control.drop_slot(&self.slot).await?;
                    control.create_slot(&self.slot).await?;
                    created = true;
                } else if let Some(pid) = slot.active_pid {
                    return Err(Stop::Retry(Error::replication(
                        format!("replication slot {} is in use by server process {pid} (a relay that just stopped?)", self.slot),
                        true,
                    )));
                }
            }
        }
        if created {
            if !self.catch_up(control, shutdown).await? {
                return Ok(());
            }
            control.caught_up(&self.slot).await?;
        }
        let mut deferred = Deferred {
            keys: control.deferred(created).await?.into_iter().collect(),
            ..Deferred::default()
        };
        if !deferred.keys.is_empty() {
            deferred.sweep_in(Duration::ZERO);
        }
        let buffer = self.config.batch_size.saturating_mul(2);
        let stream = Stream::start(
            self.url,
            state.server,
            &self.slot,
            &state.publication,
            buffer,
            self.config.max_batch_bytes,
        )
        .await?;
        tracing::info!(slot = %self.slot, publication = %state.publication, deferred_aggregates = deferred.keys.len(), "streaming from the replication slot");
        self.metrics.wal_streaming.set(1);
        self.health.set_listener(true);
        let result = self.stream(control, stream, deferred, shutdown).await;
        // A batch claimed but not published when the stream stopped (an error, a lost leadership)
        // must not keep its rows locked through the pause: its connection goes, the rows are
        // pending again for whoever streams next.
        self.stores.iter_mut().for_each(Store::reset);
        result
    }

    /// Behind a new slot: publishes from the table what committed before it (as the table source
    /// does, in seq order), until a claim is not full. Rows committed after the slot's start come
    /// again in the stream, and the claim by id skips those published here. `false`: shutdown.
    async fn catch_up(
        &mut self,
        control: &Control,
        shutdown: &CancellationToken,
    ) -> std::result::Result<bool, Stop> {
        let mut published = 0;
        loop {
            if shutdown.is_cancelled() {
                return Ok(false);
            }
            let result = process_batch(
                self.config,
                &self.publisher,
                self.metrics,
                &mut self.stores[0],
            )
            .await;
            match result {
                Ok(report) if report.broker_failures == 0 && !report.full => {
                    published += report.published;
                    tracing::info!(published, "caught up from the table");
                    return Ok(true);
                }
                Ok(report) => {
                    published += report.published;
                    if report.broker_failures > 0 && !self.back_off(shutdown).await {
                        return Ok(false);
                    }
                }
                Err(e) => {
                    if control.is_closed() {
                        return Err(Stop::Retry(e));
                    }
                    self.recover(&e);
                    tracing::warn!(error = %e, "catching up from the table failed; backing off");
                    if !self.back_off(shutdown).await {
                        return Ok(false);
                    }
                }
            }
        }
    }

    async fn stream(
        &mut self,
        control: &Control,
        mut stream: Stream,
        mut deferred: Deferred,
        shutdown: &CancellationToken,
    ) -> std::result::Result<(), Stop> {
        let mut batch = Batch::default();
        // Rows carried over (committed, not visible yet when claimed), until a batch takes them: the
        // slot's position waits for them. They are never given up: the stream sent their commit.
        let mut carried: HashSet<Uuid> = HashSet::new();
        // The batch claimed but not published yet.
        let mut open: Option<InFlight> = None;
        // The batch published and settled, its outcome not recorded yet.
        let mut finishing: Option<Finishing> = None;
        // The newest position of recorded batches, confirmed once no row before it is carried.
        let mut confirm: Option<u64> = None;
        // The broker had trouble with part of the last batch published: record it, then pause.
        let mut hold = false;
        loop {
            // Between steps too: a stream that never pauses must not keep the relay from stopping.
            if shutdown.is_cancelled() {
                break;
            }
            if control.is_closed() {
                return Err(Stop::Retry(Error::replication(
                    "the control connection (the leadership) was lost",
                    true,
                )));
            }
            // A sweep that is due runs once the pipeline is empty (no new batch is claimed
            // meanwhile), so that a stream that never pauses does not keep it waiting.
            let sweep_due = deferred.sweep_at.is_some_and(|at| at <= Instant::now());
            if open.is_none() && finishing.is_none() {
                if sweep_due {
                    deferred.sweep_at = None;
                    self.sweep(&mut deferred).await;
                    continue;
                }
                // Nothing in flight: wait for the stream (or a sweep, a wake-up, shutdown).
                if batch.candidates.is_empty() {
                    let sweep_at = deferred.sweep_at;
                    let first = tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = sleep_until(sweep_at.unwrap_or_else(Instant::now).into()), if sweep_at.is_some() => {
                            deferred.sweep_at = None;
                            self.sweep(&mut deferred).await;
                            continue;
                        }
                        _ = control.woken() => {
                            // Rows became publishable again (`dead-letters retry`).
                            if !deferred.keys.is_empty() {
                                deferred.sweep_in(Duration::ZERO);
                            }
                            continue;
                        }
                        change = stream.next() => change?,
                    };
                    let Some(first) = first else {
                        return Err(Stop::Retry(Error::replication(
                            "the server ended the replication stream",
                            true,
                        )));
                    };
                    batch.take(first);
                } else {
                    // Rows carried over: committed, but not visible yet when they were claimed.
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(VISIBILITY_RETRY) => {}
                    }
                }
            }
            batch.fill(&mut stream, self.config)?;
            let step = self
                .step(
                    &mut batch,
                    &deferred,
                    finishing.take(),
                    if hold { None } else { open.take() },
                    hold || sweep_due,
                )
                .await;
            let pause = std::mem::take(&mut hold);
            let mut failure = step.failure;
            if let Some((covered, report)) = step.recorded {
                if !covered.handed.is_empty() {
                    tracing::info!(
                        aggregates = covered.handed.len(),
                        "aggregates handed to the table (a failed or held event)"
                    );
                    deferred.keys.extend(covered.handed);
                    deferred.sweep_in(report.next_retry.unwrap_or(self.config.fallback_interval));
                }
                confirm = confirm.max(covered.position);
                if report.broker_failures == 0 && failure.is_none() {
                    self.trouble.reset();
                }
            }
            let mut next = step.claimed;
            if let Some(published) = step.published {
                // Rows of this batch no longer carried are done (published, or handed to the
                // table once it is recorded); the carried ones, and the next batch's rows of their
                // aggregates, go again.
                let mut carry = published.carry;
                let carried_ids: HashSet<Uuid> = carry.iter().map(|c| c.id).collect();
                for c in &published.finishing.covered.candidates {
                    if !carried_ids.contains(&c.id) {
                        carried.remove(&c.id);
                    }
                }
                if let Some(next) = &mut next {
                    // The next batch must not overtake the rows carried over.
                    let aggregates: HashSet<AggregateKey> =
                        carry.iter().map(|c| c.aggregate.clone()).collect();
                    let (later, keep): (Vec<Candidate>, Vec<Candidate>) =
                        std::mem::take(&mut next.covered.candidates)
                            .into_iter()
                            .partition(|c| aggregates.contains(&c.aggregate));
                    next.covered.candidates = keep;
                    carry.extend(later);
                    next.skip.extend(aggregates);
                }
                carried.extend(carry.iter().map(|c| c.id));
                batch.requeue(carry);
                if published.finishing.published.report.broker_failures > 0 {
                    tracing::warn!(
                        published = published.finishing.published.report.published,
                        broker_failures = published.finishing.published.report.broker_failures,
                        "broker trouble during a batch; backing off"
                    );
                    hold = true;
                }
                finishing = Some(published.finishing);
            }
            if !step.unwind.is_empty() {
                // Not recorded: what was in flight goes again, in stream order (requeued from
                // the newest, each in front of the rest).
                // The batch claimed after them: this step's claim, or the one held through a pause.
                if let Some(later) = next.take().or_else(|| open.take()) {
                    self.stores[later.store].reset();
                    batch.requeue_done(later.covered);
                }
                for covered in step.unwind.into_iter().rev() {
                    batch.requeue_done(covered);
                }
            }
            open = next.or(open);
            // The slot moves on only while no row before the position is carried.
            if open.is_none() && finishing.is_none() && batch.candidates.is_empty() {
                confirm = confirm.max(batch.confirmable());
            }
            if carried.is_empty() {
                if let Some(lsn) = confirm.take() {
                    stream.confirm(lsn);
                }
            }
            if let Some(e) = failure.take() {
                if !self.batch_failed(control, e, shutdown).await? {
                    break;
                }
            } else if pause && !self.back_off(shutdown).await {
                break;
            }
        }
        // Shutdown: the batch published is recorded (its events went out); one claimed but not
        // published is undone (its rows are pending again); whatever was not confirmed streams
        // again to the next leader.
        if let Some(f) = finishing {
            if let Err(e) = f.finish(&mut self.stores, self.metrics).await {
                tracing::warn!(error = %e, "recording the last batch failed; its events go out again");
            }
        }
        if let Some(inflight) = open {
            self.stores[inflight.store].reset();
        }
        stream.stop().await;
        Ok(())
    }

    /// One step of the pipeline, on three connections side by side: records the batch published
    /// before (`finishing`), publishes the batch claimed before (`open`, leaving out what the
    /// recorded batch hands to the table) and claims the next from `batch` unless `no_claim`.
    async fn step(
        &mut self,
        batch: &mut Batch,
        deferred: &Deferred,
        finishing: Option<Finishing>,
        open: Option<InFlight>,
        no_claim: bool,
    ) -> Step {
        let fin_store = finishing.as_ref().map(|f| f.store);
        let pub_store = open.as_ref().map(|o| o.store);
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
        let (fin_work, fin_covered) = match finishing {
            Some(f) => (Some((f.claim, f.published)), Some(f.covered)),
            None => (None, None),
        };
        let (pub_work, pub_covered, mut skip) = match open {
            Some(o) => (Some(o.claim), Some(o.covered), o.skip),
            None => (None, None, HashSet::new()),
        };
        // The batch being recorded hands these to the table: the next one leaves them out.
        if let Some(done) = &fin_covered {
            skip.extend(done.handed.iter().cloned());
        }
        let metrics = self.metrics;
        let record = async {
            match (fin_work, fin_s) {
                (Some((claim, published)), Some(store)) => Some(match store.resume(claim) {
                    Ok(claim) => published.finish(claim, metrics).await,
                    Err(e) => Err(e),
                }),
                _ => None,
            }
        };
        let publish = async {
            match (pub_work, pub_s) {
                (Some(claim), Some(store)) => Some(
                    publish_claimed(
                        self.config,
                        &self.publisher,
                        metrics,
                        store,
                        claim,
                        &deferred.keys,
                        &skip,
                    )
                    .await,
                ),
                _ => None,
            }
        };
        let claim = async {
            match claim_s {
                Some(store) if !no_claim => {
                    let limits = (self.config.batch_size, self.config.max_batch_bytes);
                    Some(claim_next(batch, deferred, store, claim_store, limits).await)
                }
                _ => None,
            }
        };
        let (recorded, published, claimed) = tokio::join!(record, publish, claim);
        let mut step = Step::default();
        match claimed {
            Some(Ok(next)) => step.claimed = next,
            Some(Err((e, candidates))) => {
                batch.requeue(candidates);
                step.failure = Some(e);
            }
            None => {}
        }
        let recorded_ok = match (recorded, fin_covered) {
            (Some(Ok(report)), Some(covered)) => {
                step.recorded = Some((covered, report));
                true
            }
            (Some(Err(e)), Some(covered)) => {
                step.unwind.push(covered);
                step.failure = Some(e);
                false
            }
            _ => true,
        };
        match (published, pub_covered) {
            (Some(Ok((claim, published, handed, carry))), Some(mut covered)) if recorded_ok => {
                covered.handed = handed;
                step.published = Some(PublishedBatch {
                    finishing: Finishing {
                        store: pub_store.unwrap_or(0),
                        claim,
                        published,
                        covered,
                    },
                    carry,
                });
            }
            (Some(result), Some(covered)) => {
                // Not published (a broker outage rolled it back; a lost connection), or published
                // after a batch before it that could not be recorded: it goes again.
                if let Some(store) = pub_store {
                    self.stores[store].reset();
                }
                if let Err(e) = result {
                    step.failure.get_or_insert(e);
                }
                step.unwind.push(covered);
            }
            _ => {}
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

    /// Sweeps a round of the aggregates handed to the table: publishes what may go now and takes
    /// back those left with nothing pending. Errors are logged; the sweep comes again.
    async fn sweep(&mut self, deferred: &mut Deferred) {
        let round = deferred.next_round(SWEEP_AGGREGATES);
        if round.is_empty() {
            return;
        }
        let per_aggregate = (self.config.batch_size / round.len()).max(1);
        let started = Instant::now();
        let mut taken_back = Vec::new();
        let mut next_due = None;
        let result = match self.stores[0]
            .sweep(
                &round,
                per_aggregate,
                self.config.batch_size,
                self.config.max_batch_bytes,
            )
            .await
        {
            Ok((claim, info)) => {
                next_due = info.next_due;
                let complete = info.complete;
                run_claim(
                    self.config,
                    &self.publisher,
                    self.metrics,
                    claim,
                    started,
                    |claim, unsettled| {
                        // Taken back: the aggregates whose every pending row was in this sweep
                        // and went out. Not those stopped at a row held elsewhere or not
                        // visible, nor those with a failure.
                        let mut not_out: HashSet<AggregateKey> = unsettled.into_iter().collect();
                        not_out.extend(claim.defer.iter().cloned());
                        not_out.extend(claim.carry.iter().map(|c| c.aggregate.clone()));
                        let out: HashSet<AggregateKey> = claim
                            .groups
                            .iter()
                            .filter_map(|g| g.first())
                            .map(|e| (e.aggregate_type.clone(), e.aggregate_id.clone()))
                            .filter(|k| !not_out.contains(k))
                            .collect();
                        claim
                            .undefer
                            .extend(complete.into_iter().filter(|k| out.contains(k)));
                        taken_back = claim.undefer.clone();
                    },
                )
                .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(report) => {
                for key in &taken_back {
                    deferred.keys.remove(key);
                }
                if report.broker_failures > 0 {
                    let delay = self.trouble_delay();
                    deferred.sweep_in(delay);
                } else if report.published > 0 || report.full {
                    // More may be waiting behind what went out.
                    deferred.sweep_in(Duration::ZERO);
                } else if !deferred.keys.is_empty() {
                    let wait = [
                        next_due,
                        report.next_retry,
                        Some(self.config.fallback_interval),
                    ]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(self.config.fallback_interval);
                    deferred.sweep_in(wait);
                }
                if report.broker_failures == 0 {
                    self.trouble.reset();
                }
            }
            Err(e) => {
                self.recover(&e);
                let delay = self.trouble_delay();
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "sweep of the aggregates handed to the table failed");
                deferred.sweep_in(delay);
            }
        }
    }

    async fn back_off(&mut self, shutdown: &CancellationToken) -> bool {
        let delay = self.trouble_delay();
        pause(shutdown, delay).await
    }

    fn trouble_delay(&mut self) -> Duration {
        self.trouble
            .next_backoff()
            .unwrap_or(Duration::from_secs(10))
    }

    /// After a failed batch: the worker connection may be broken (the broker's outage needs
    /// nothing but the pause).
    fn recover(&mut self, e: &Error) {
        if !e.is_broker_unavailable() {
            self.stores.iter_mut().for_each(Store::reset);
        }
    }
}

/// What a batch in flight stands for in the stream.
struct Covered {
    /// What was claimed, in stream order: claimed again if the batch has to be retried.
    candidates: Vec<Candidate>,
    /// The position to confirm once the batch is recorded.
    position: Option<u64>,
    /// Aggregates the batch hands to the table (known once it is settled).
    handed: Vec<AggregateKey>,
}

/// A batch claimed on `stores[store]`, not published yet.
struct InFlight {
    store: usize,
    claim: OpenClaim,
    covered: Covered,
    /// Aggregates not to publish in this batch: rows of a batch before carried over, or handed to
    /// the table by the batch recorded while this one publishes.
    skip: HashSet<AggregateKey>,
}

/// A batch published and settled on `stores[store]`, its outcome not recorded yet.
struct Finishing {
    store: usize,
    claim: OpenClaim,
    published: Published,
    covered: Covered,
}

impl Finishing {
    async fn finish(self, stores: &mut [Store], metrics: &Metrics) -> Result<BatchReport> {
        let claim = stores[self.store].resume(self.claim)?;
        self.published.finish(claim, metrics).await
    }
}

/// A batch this step published: to record in the next step; `carry`, its rows to claim again.
struct PublishedBatch {
    finishing: Finishing,
    carry: Vec<Candidate>,
}

/// What one step of the pipeline did.
#[derive(Default)]
struct Step {
    /// The batch recorded, and its report.
    recorded: Option<(Covered, BatchReport)>,
    published: Option<PublishedBatch>,
    claimed: Option<InFlight>,
    /// Batches not recorded (a failure on the way), oldest first: they go again.
    unwind: Vec<Covered>,
    failure: Option<Error>,
}

/// Claims what the batch holds (aggregates handed to the table left out) on `store`, at most one
/// batch's worth (`limits`: rows, bytes; the first row always): after a failure the batches that
/// were in flight go back in front together. On failure returns the candidates with the error,
/// to be claimed again.
async fn claim_next(
    batch: &mut Batch,
    deferred: &Deferred,
    store: &mut Store,
    index: usize,
    limits: (usize, usize),
) -> std::result::Result<Option<InFlight>, (Error, Vec<Candidate>)> {
    let (candidates, position) = batch.cut(&deferred.keys, limits);
    if candidates.is_empty() {
        // Only the position moves on (with the next batch that finishes).
        batch.last_commit = batch.last_commit.max(position);
        return Ok(None);
    }
    match store.claim_ids(&candidates).await {
        Ok(claim) => Ok(Some(InFlight {
            store: index,
            claim: claim.into_open(),
            covered: Covered {
                candidates,
                position,
                handed: Vec::new(),
            },
            skip: HashSet::new(),
        })),
        Err(e) => {
            batch.last_commit = batch.last_commit.max(position);
            Err((e, candidates))
        }
    }
}

/// Publishes and settles a claimed batch; its outcome is recorded later ([`Finishing`]). Groups of
/// aggregates in `blocked` (handed to the table) or `skip` are not published: the commit puts
/// their rows back. Returns the claim, the settlement, the aggregates handed to the table and the
/// rows to claim again. A broker outage rolls the claim back.
async fn publish_claimed(
    config: &RelayConfig,
    publisher: &Publisher,
    metrics: &Metrics,
    store: &mut Store,
    mut open: OpenClaim,
    blocked: &BTreeSet<AggregateKey>,
    skip: &HashSet<AggregateKey>,
) -> Result<(OpenClaim, Published, Vec<AggregateKey>, Vec<Candidate>)> {
    let started = Instant::now();
    open.groups_mut().retain(|g| {
        g.first().is_none_or(|e| {
            let key = (e.aggregate_type.clone(), e.aggregate_id.clone());
            !blocked.contains(&key) && !skip.contains(&key)
        })
    });
    let carry = open.take_carry();
    let mut claim = store.resume(open)?;
    let mut handed = Vec::new();
    let result = publish_claim(
        config,
        publisher,
        metrics,
        &mut claim,
        started,
        |claim, unsettled| {
            for key in unsettled {
                if !claim.defer.contains(&key) {
                    claim.defer.push(key);
                }
            }
            handed = claim.defer.clone();
        },
    )
    .await;
    match result {
        Ok(published) => {
            // Recording needs the ids only: the rows' content goes now, so that no more than two
            // batches' rows (this one publishing, the next claimed) are held at once.
            let mut open = claim.into_open();
            *open.groups_mut() = Vec::new();
            Ok((open, published, handed, carry))
        }
        Err(e) => {
            claim.rollback().await?;
            Err(e)
        }
    }
}

impl Batch {
    /// Puts candidates back in front of the batch (they are older than what it holds).
    fn requeue(&mut self, mut candidates: Vec<Candidate>) {
        candidates.append(&mut self.candidates);
        self.candidates = candidates;
    }

    /// Takes the candidates to claim now, aggregates handed to the table left out: at most
    /// `limits` (rows, bytes; the first row always), with the position to confirm once they are
    /// recorded (`None` while rows are left behind: the position goes with the last of them).
    fn cut(
        &mut self,
        deferred: &BTreeSet<AggregateKey>,
        (max_rows, max_bytes): (usize, usize),
    ) -> (Vec<Candidate>, Option<u64>) {
        let mut candidates: Vec<Candidate> = std::mem::take(&mut self.candidates)
            .into_iter()
            .filter(|c| !deferred.contains(&c.aggregate))
            .collect();
        let mut bytes = 0usize;
        let fit = candidates
            .iter()
            .enumerate()
            .take_while(|(i, c)| {
                bytes = bytes.saturating_add(c.size);
                *i == 0 || (*i < max_rows && bytes <= max_bytes)
            })
            .count();
        self.candidates = candidates.split_off(fit);
        self.bytes = self.candidates.iter().map(|c| c.size).sum();
        let position = if self.candidates.is_empty() {
            self.confirmable()
        } else {
            None
        };
        (candidates, position)
    }

    /// Puts a batch that was not recorded back in front, with its position.
    fn requeue_done(&mut self, covered: Covered) {
        self.requeue(covered.candidates);
        self.last_commit = self.last_commit.max(covered.position);
    }

    /// Takes what the stream has ready, up to the batch's limits, without waiting.
    fn fill(&mut self, stream: &mut Stream, config: &RelayConfig) -> Result<()> {
        while self.candidates.len() < config.batch_size && self.bytes < config.max_batch_bytes {
            match stream.ready()? {
                Some(change) => self.take(change),
                None => break,
            }
        }
        Ok(())
    }

    fn take(&mut self, change: Change) {
        match change {
            Change::Begin => self.in_tx = true,
            Change::Insert(row) => {
                self.bytes = self.bytes.saturating_add(row.size);
                self.candidates.push(row);
            }
            Change::Commit { end } => {
                self.in_tx = false;
                self.last_commit = Some(end);
            }
            Change::Idle { wal_end } => {
                if self.candidates.is_empty() && !self.in_tx {
                    self.idle = Some(wal_end);
                }
            }
        }
    }

    /// The position to confirm now that the batch is done (its events published or in the
    /// table).
    fn confirmable(&mut self) -> Option<u64> {
        [self.last_commit.take(), self.idle.take()]
            .into_iter()
            .flatten()
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: &str) -> AggregateKey {
        ("order".into(), i.into())
    }

    #[test]
    fn sweeps_go_round_the_deferred_aggregates() {
        let mut d = Deferred {
            keys: ["a", "b", "c"].into_iter().map(key).collect(),
            ..Deferred::default()
        };
        assert_eq!(d.next_round(2), [key("a"), key("b")]);
        assert_eq!(d.next_round(2), [key("c"), key("a")]);
        assert_eq!(d.next_round(5), [key("b"), key("c"), key("a")]);
        d.keys.clear();
        assert!(d.next_round(2).is_empty());
    }

    fn sized(aggregate: &str, size: usize) -> Candidate {
        Candidate {
            id: Uuid::new_v4(),
            aggregate: key(aggregate),
            xid: 1,
            size,
        }
    }

    #[test]
    fn a_cut_takes_one_batch_at_most_and_its_position_goes_with_the_last_rows() {
        let mut b = Batch::default();
        for a in ["a", "b", "c", "d", "e"] {
            b.take(Change::Insert(sized(a, 10)));
        }
        b.take(Change::Commit { end: 50 });
        let none = BTreeSet::new();
        // Three rows at most: two left behind, and the position waits for them.
        let (first, position) = b.cut(&none, (3, 1000));
        assert_eq!(first.len(), 3);
        assert_eq!(position, None);
        assert_eq!((b.candidates.len(), b.bytes), (2, 20));
        let (rest, position) = b.cut(&none, (3, 1000));
        assert_eq!(rest.len(), 2);
        assert_eq!(position, Some(50));
        // By bytes: 25 fit two rows of 10; a first row over the budget goes alone.
        b.requeue(vec![sized("a", 10), sized("b", 10), sized("c", 10)]);
        assert_eq!(b.cut(&none, (10, 25)).0.len(), 2);
        b.requeue(vec![sized("a", 100), sized("b", 1)]);
        assert_eq!(b.cut(&none, (10, 25)).0.len(), 1);
        b.candidates.clear();
        // Aggregates handed to the table are left out, not left behind.
        b.requeue(vec![sized("a", 1), sized("x", 1), sized("b", 1)]);
        let handed: BTreeSet<AggregateKey> = [key("x")].into_iter().collect();
        let (taken, _) = b.cut(&handed, (10, 100));
        assert_eq!(taken.len(), 2);
        assert!(b.candidates.is_empty());
    }

    #[test]
    fn the_position_confirmed_is_the_last_commit_or_an_idle_keepalive() {
        let mut b = Batch::default();
        b.take(Change::Begin);
        b.take(Change::Idle { wal_end: 5 }); // inside a transaction: not confirmable
        b.take(Change::Commit { end: 10 });
        assert_eq!(b.confirmable(), Some(10));
        assert_eq!(b.confirmable(), None);
        b.take(Change::Idle { wal_end: 20 });
        assert_eq!(b.confirmable(), Some(20));
    }
}
