//! One batch: claim, publish, settle the outcomes under the retry policy, record, commit.

mod observe;
mod settle;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::config::{BatchConfig, RetryConfig};
use crate::error::{Error, Result};
use crate::event::AggregateKey;
use crate::metrics::Metrics;
use crate::policy::Outcome;
use crate::policy::{is_broker_outage, RetryPolicy, WAKE_HEADS};
use crate::publisher::{Publisher, ATOMIC_BATCH_MAX};
use crate::source::atomic;
use crate::source::store::{BeforeCommit, Claim, CommitOrder, Failure, Split, Store};
use observe::{note_plan, observe};
use settle::{settle, split_transactions};

/// What one batch (or two in flight together) did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchReport {
    pub claimed: usize,
    /// The claim stopped at a limit: more rows are probably waiting.
    pub full: bool,
    pub published: usize,
    pub failed: usize,
    /// Failures that were the broker's trouble (no attempt spent): back off before the next batch.
    pub broker_failures: usize,
    /// Earliest retry time among rows that failed and will be retried.
    pub next_retry: Option<Duration>,
}

impl BatchReport {
    /// Two batches run side by side: full if either was full, empty only if both were.
    pub fn merge(self, other: BatchReport) -> BatchReport {
        BatchReport {
            claimed: self.claimed.max(other.claimed),
            full: self.full || other.full,
            published: self.published + other.published,
            failed: self.failed + other.failed,
            broker_failures: self.broker_failures + other.broker_failures,
            next_retry: earliest(self.next_retry, other.next_retry),
        }
    }
}

fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Which claim a batch starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claiming {
    /// The claim of the configured ordering.
    Full,
    /// Heads only, in per-aggregate order: the first batch after a writer's notification at idle (see
    /// [`Store::claim_heads`]).
    Heads,
}

/// One transaction on `store`: claim, publish, record, commit.
pub(crate) async fn process_batch(
    batch: &BatchConfig,
    retry: &RetryConfig,
    publisher: &Publisher,
    metrics: &Metrics,
    store: &mut Store,
    claiming: Claiming,
) -> Result<BatchReport> {
    let started = Instant::now();
    let claim = match claiming {
        Claiming::Full => {
            store
                .claim(batch.ordering, batch.size, batch.max_bytes)
                .await?
        }
        Claiming::Heads => {
            store
                .claim_heads(batch.size.min(WAKE_HEADS), batch.max_bytes)
                .await?
        }
    };
    run_claim(retry, publisher, metrics, claim, started, ()).await
}

/// The rest of a batch once claimed: publish, settle, record (with the source's own bookkeeping,
/// `before_commit`), commit.
pub(crate) async fn run_claim(
    retry: &RetryConfig,
    publisher: &Publisher,
    metrics: &Metrics,
    claim: Claim<'_>,
    started: Instant,
    before_commit: impl BeforeCommit,
) -> Result<BatchReport> {
    run_claim_with(retry, publisher, metrics, claim, started, None, |_, _| {
        before_commit
    })
    .await
}

/// [`run_claim`], with the bookkeeping decided from the settled outcome (a sweep takes back the
/// aggregates that went out) and the source's commit order (`order`, see [`publish_claim`]).
pub(crate) async fn run_claim_with<B: BeforeCommit>(
    retry: &RetryConfig,
    publisher: &Publisher,
    metrics: &Metrics,
    mut claim: Claim<'_>,
    started: Instant,
    order: Option<&dyn CommitOrder>,
    before_commit: impl FnOnce(&Published, &Claim<'_>) -> B,
) -> Result<BatchReport> {
    match publish_claim(retry, publisher, metrics, &mut claim, started, order).await {
        Ok(settled) => {
            let record = before_commit(&settled, &claim);
            settled.finish_with(claim, metrics, record).await
        }
        Err(e) => {
            // A broker outage spends no attempts: the rollback releases the rows.
            claim.rollback().await?;
            Err(e)
        }
    }
}

/// A claim published and settled, its outcome not recorded yet: [`Published::finish_with`] records it
/// and commits. A pipelined source publishes the next batch meanwhile.
pub(crate) struct Published {
    pub report: BatchReport,
    /// The aggregates whose events were not all published (a failure, or put back behind one).
    pub unsettled: Vec<AggregateKey>,
    published: Vec<Uuid>,
    failures: Vec<Failure>,
    /// The published events whose transaction this batch did not publish whole.
    split: Split,
    started: Instant,
    claim_ms: f64,
    /// `None`: nothing was published (no batch metrics or log).
    publish_ms: Option<f64>,
}

/// Publishes a claim and settles the outcomes (see [`run_claim`]); nothing is recorded yet. The
/// error is a broker outage (no attempt spent): the caller rolls the claim back. `order`: what the
/// source knows of commit order beyond the claim's snapshot (the wal source's stream), which the
/// atomic completion follows for the rows it takes.
pub(crate) async fn publish_claim(
    retry: &RetryConfig,
    publisher: &Publisher,
    metrics: &Metrics,
    claim: &mut Claim<'_>,
    started: Instant,
    order: Option<&dyn CommitOrder>,
) -> Result<Published> {
    let claim_ms = started.elapsed().as_secs_f64() * 1000.0;
    let (claimed, full) = (claim.claimed, claim.full);
    let mut published = Published {
        report: BatchReport {
            claimed,
            full,
            ..Default::default()
        },
        unsettled: Vec::new(),
        published: Vec::new(),
        failures: Vec::new(),
        split: Split::default(),
        started,
        claim_ms,
        publish_ms: None,
    };
    if claim.groups.is_empty() {
        return Ok(published);
    }
    // `--transactions atomic`: the rest of each transaction the claim holds part of.
    let completion = match publisher.atomic() {
        true => Some(
            claim
                .complete_transactions(
                    ATOMIC_BATCH_MAX,
                    publisher.batch_bytes(),
                    claim.ordered,
                    order,
                )
                .await?,
        ),
        false => None,
    };
    // The transaction headers; a failure here is the database's, as a claim's would be.
    let runs = claim.read_transactions().await?;
    let publish_started = Instant::now();
    let mut postponed = 0;
    let outcomes = match &completion {
        Some(completion) => {
            let plan = atomic::plan(&claim.groups, completion, ATOMIC_BATCH_MAX);
            note_plan(metrics, &claim.groups, &plan);
            postponed = plan.postponed;
            publisher.publish_atomic(&claim.groups, &plan).await
        }
        None => publisher.publish(&claim.groups).await,
    };
    let publish_s = publish_started.elapsed().as_secs_f64();
    metrics.publish_duration.observe(publish_s);
    published.publish_ms = Some(publish_s * 1000.0);

    if is_broker_outage(outcomes.iter().flatten()) {
        return Err(Error::broker_unavailable(
            first_failure(&outcomes).unwrap_or_else(|| "no ack".into()),
        ));
    }

    let policy = RetryPolicy::of(retry);
    // Published events are counted per event type once per batch, in the order the types came.
    let mut tally: Vec<(&str, u64)> = Vec::new();
    let settlement = settle(&policy, &claim.groups, &outcomes, |s| {
        observe(metrics, &mut tally, s)
    });
    for (event_type, n) in tally {
        metrics.count_published_n(event_type, n);
    }
    published.unsettled = claim
        .groups
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| !o.iter().all(|o| matches!(o, Outcome::Published { .. })))
        .filter_map(|(g, _)| g.first())
        .map(|e| (e.aggregate_type.clone(), e.aggregate_id.clone()))
        .collect();
    published.report = BatchReport {
        claimed,
        full,
        ..settlement.report
    };
    if postponed > 0 && postponed == claim.groups.iter().map(Vec::len).sum::<usize>() {
        // Every event postponed (its transaction's other rows locked elsewhere, waiting for a
        // retry or dead): claiming again at once would find the same. As for an empty claim,
        // wait for a notification, the fallback ticker, or a short while.
        published.report.claimed = 0;
        published.report.full = false;
        published.report.next_retry = earliest(published.report.next_retry, Some(POSTPONED_RETRY));
    }
    published.split = split_transactions(&claim.groups, &settlement.published, &runs);
    published.published = settlement.published;
    published.failures = settlement.failures;
    Ok(published)
}

impl Published {
    /// The events acked.
    pub fn acked(&self) -> &[Uuid] {
        &self.published
    }

    /// Records the outcome in the claim's transaction, with the source's own bookkeeping
    /// (`before_commit`, or `()`), and commits.
    pub async fn finish_with(
        self,
        claim: Claim<'_>,
        metrics: &Metrics,
        before_commit: impl BeforeCommit,
    ) -> Result<BatchReport> {
        let finish_started = Instant::now();
        claim
            .finish_with(&self.published, &self.failures, &self.split, before_commit)
            .await?;
        let report = self.report;
        let Some(publish_ms) = self.publish_ms else {
            return Ok(report);
        };
        let finish_ms = finish_started.elapsed().as_secs_f64() * 1000.0;
        let elapsed = self.started.elapsed();
        metrics.batch_duration.observe(elapsed.as_secs_f64());
        tracing::debug!(
            batch_size = report.claimed,
            published = report.published,
            failed = report.failed,
            elapsed_ms = elapsed.as_secs_f64() * 1000.0,
            claim_ms = self.claim_ms,
            publish_ms,
            finish_ms,
            "batch done"
        );
        Ok(report)
    }
}

/// When a batch (`--transactions atomic`) could publish nothing because every event's transaction
/// was postponed, claim again after this long at the latest.
const POSTPONED_RETRY: Duration = Duration::from_millis(250);

fn first_failure(outcomes: &[Vec<Outcome>]) -> Option<String> {
    outcomes.iter().flatten().find_map(|o| match o {
        Outcome::Failed(f) => Some(f.message.clone()),
        _ => None,
    })
}
