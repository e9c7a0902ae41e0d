//! One batch: claim, publish, settle the outcomes under the retry policy, record, commit.

use std::time::{Duration, Instant, SystemTime};

use uuid::Uuid;

use crate::config::{BatchConfig, RetryConfig};
use crate::error::{Error, Result};
use crate::event::AggregateKey;
use crate::event::OutboxEvent;
use crate::metrics::Metrics;
use crate::policy::Outcome;
use crate::policy::{is_broker_outage, FailureKind, RetryPolicy, Verdict, WAKE_HEADS};
use crate::publisher::{Publisher, ATOMIC_BATCH_MAX};
use crate::source::atomic;
use crate::source::store::{BeforeCommit, Claim, CommitOrder, Failure, Runs, Split, Store};

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

/// One event's settled outcome, for metrics and logs.
pub(crate) enum Settled<'a> {
    Published {
        event: &'a OutboxEvent,
        duplicate: bool,
        acked_at: SystemTime,
    },
    Failed {
        event: &'a OutboxEvent,
        kind: FailureKind,
        message: &'a str,
        verdict: Verdict,
        /// The event's send span: the failure is logged inside it.
        span: &'a tracing::Span,
    },
}

/// What a batch records: the rows to keep marked, the failures, and the report.
pub(crate) struct Settlement {
    pub published: Vec<Uuid>,
    pub failures: Vec<Failure>,
    pub report: BatchReport,
}

/// Applies the retry policy to each outcome of `groups` (the claim, in publish order), telling
/// `observe` about each event settled. Held-back events (an earlier one of their aggregate failed)
/// are neither published nor failed: the record puts them back as they were.
pub(crate) fn settle<'a>(
    policy: &RetryPolicy,
    groups: &'a [Vec<OutboxEvent>],
    outcomes: &'a [Vec<Outcome>],
    mut observe: impl FnMut(Settled<'a>),
) -> Settlement {
    let mut settlement = Settlement {
        published: Vec::with_capacity(groups.iter().map(Vec::len).sum()),
        failures: Vec::new(),
        report: BatchReport::default(),
    };
    let report = &mut settlement.report;
    for (group, group_outcomes) in groups.iter().zip(outcomes) {
        for (event, outcome) in group.iter().zip(group_outcomes) {
            match outcome {
                Outcome::Published {
                    duplicate,
                    acked_at,
                } => {
                    settlement.published.push(event.id);
                    observe(Settled::Published {
                        event,
                        duplicate: *duplicate,
                        acked_at: *acked_at,
                    });
                }
                Outcome::Failed(f) => {
                    let verdict = policy.verdict(event.attempts, f.kind);
                    if f.kind.is_brokers() {
                        report.broker_failures += 1;
                    }
                    if !verdict.dead_letter {
                        report.next_retry = earliest(report.next_retry, Some(verdict.retry_in));
                    }
                    settlement.failures.push(Failure {
                        id: event.id,
                        error: f.message.clone(),
                        retry_in: verdict.retry_in,
                        dead_letter: verdict.dead_letter,
                        spend_attempt: verdict.spend_attempt,
                    });
                    observe(Settled::Failed {
                        event,
                        kind: f.kind,
                        message: &f.message,
                        verdict,
                        span: &f.span,
                    });
                }
                Outcome::NotAttempted => {}
            }
        }
    }
    report.published = settlement.published.len();
    report.failed = settlement.failures.len();
    settlement
}

/// The events of `published` (the ids acked, among `groups`) whose transaction they are not the
/// whole of: the transaction's count is not known, or more of its events than were published
/// here. Events without a transaction are never split. A split transaction among `runs` (its
/// rows are consecutive seqs) is kept as a run, its events are not.
pub(crate) fn split_transactions(
    groups: &[Vec<OutboxEvent>],
    published: &[Uuid],
    runs: &Runs,
) -> Split {
    let acked: std::collections::HashSet<&Uuid> = published.iter().collect();
    let mut per_tx: std::collections::HashMap<u64, (u64, Option<u64>)> =
        std::collections::HashMap::new();
    let events = || {
        groups
            .iter()
            .flatten()
            .filter(|e| acked.contains(&e.id))
            .filter_map(|e| e.transaction.map(|t| (e.id, t)))
    };
    for (_, t) in events() {
        let entry = per_tx.entry(t.id).or_insert((0, t.events));
        entry.0 += 1;
    }
    let mut split = Split::default();
    for (id, t) in events() {
        let whole = per_tx
            .get(&t.id)
            .is_some_and(|(here, count)| *count == Some(*here));
        if whole {
            continue;
        }
        let first = !split.txids.contains(&t.id);
        if first {
            split.txids.push(t.id);
        }
        match runs.get(&t.id) {
            Some(&(first_seq, events)) if first => split.runs.push((t.id, first_seq, events)),
            Some(_) => {}
            None => split.ids.push(id),
        }
    }
    split
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
    /// The aggregates whose events were not all published (a failure, or held back behind one).
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
    let mut held = 0;
    let outcomes = match &completion {
        Some(completion) => {
            let plan = atomic::plan(&claim.groups, completion, ATOMIC_BATCH_MAX);
            note_plan(metrics, &claim.groups, &plan);
            held = plan.held;
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
    if held > 0 && held == claim.groups.iter().map(Vec::len).sum::<usize>() {
        // Every event held (its transaction's other rows locked elsewhere, waiting for a
        // retry or dead): claiming again at once would find the same. As for an empty claim,
        // wait for a notification, the fallback ticker, or a short while.
        published.report.claimed = 0;
        published.report.full = false;
        published.report.next_retry = earliest(published.report.next_retry, Some(HELD_RETRY));
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
/// was held, claim again after this long at the latest.
const HELD_RETRY: Duration = Duration::from_millis(250);

/// Counts and logs what an atomic plan holds back or splits.
fn note_plan(metrics: &Metrics, groups: &[Vec<OutboxEvent>], plan: &atomic::Plan) {
    if plan.held > 0 {
        metrics.transactions_held.inc_by(plan.held as u64);
        tracing::debug!(
            held = plan.held,
            "events held back: their transactions cannot go out whole in this batch"
        );
    }
    for txid in &plan.split {
        metrics.transactions_split.inc();
        let events = groups
            .iter()
            .flatten()
            .find_map(|e| e.transaction.filter(|t| t.id == *txid))
            .and_then(|t| t.events);
        tracing::warn!(
            transaction_id = txid,
            events,
            max = ATOMIC_BATCH_MAX,
            "transaction larger than one atomic batch may be (1,000 events, or the batch's byte budget): published in parts, each atomic"
        );
    }
}

/// Event types tallied per batch before counting the rest one by one (bounds the search).
const MAX_TALLY: usize = 32;

/// A log line about one event, with its identifying fields.
macro_rules! log_event {
    ($level:expr, $event:expr, $($rest:tt)+) => {
        tracing::event!(
            $level,
            event_id = %$event.id,
            event_type = %$event.event_type,
            aggregate_type = %$event.aggregate_type,
            aggregate_id = %$event.aggregate_id,
            $($rest)+
        )
    };
}

/// Metrics and logs of one settled event; a published one is added to `tally` (by event type).
fn observe<'a>(metrics: &Metrics, tally: &mut Vec<(&'a str, u64)>, settled: Settled<'a>) {
    match settled {
        Settled::Published {
            event,
            duplicate,
            acked_at,
        } => {
            // Batches hold few event types, mostly in runs: the last one first.
            let event_type = event.event_type.as_str();
            if let Some((_, n)) = tally.iter_mut().rev().find(|(t, _)| *t == event_type) {
                *n += 1;
            } else if tally.len() < MAX_TALLY {
                tally.push((event_type, 1));
            } else {
                metrics.count_published(event_type);
            }
            if let Some(lag) = event
                .created_at
                .system_time()
                .and_then(|t| acked_at.duration_since(t).ok())
            {
                metrics.commit_to_publish.observe(lag.as_secs_f64());
            }
            if duplicate {
                tracing::debug!(event_id = %event.id, event_type = %event.event_type, "already in the stream (deduplicated)");
            }
        }
        Settled::Failed {
            event,
            kind,
            message,
            verdict,
            span,
        } => {
            let _inside = span.enter();
            metrics.count_failed(&event.event_type, kind.label());
            if verdict.dead_letter {
                metrics.dead_lettered.inc();
                log_event!(
                    tracing::Level::ERROR,
                    event,
                    attempt = verdict.attempt,
                    error = %message,
                    "event dead-lettered"
                );
            } else {
                log_event!(
                    tracing::Level::WARN,
                    event,
                    attempt = verdict.attempt,
                    retry_in_ms = verdict.retry_in.as_millis() as u64,
                    error = %message,
                    "publish failed; will retry"
                );
            }
        }
    }
}

fn first_failure(outcomes: &[Vec<Outcome>]) -> Option<String> {
    outcomes.iter().flatten().find_map(|o| match o {
        Outcome::Failed(f) => Some(f.message.clone()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_is_split_unless_all_its_events_were_published_here() {
        use crate::event::TransactionPosition;
        let of = |tx: u64, index: u64, events: Option<u64>| {
            let mut e = OutboxEvent::sample("a");
            e.transaction = Some(TransactionPosition {
                id: tx,
                index,
                events,
            });
            e
        };
        let whole = [of(1, 1, Some(2)), of(1, 2, Some(2))];
        let part = [of(2, 3, Some(5)), of(2, 4, Some(5))];
        let unknown = of(3, 1, None);
        let failed = [of(4, 1, Some(2)), of(4, 2, Some(2))];
        let alone = OutboxEvent::sample("b");
        let groups = vec![
            whole.to_vec(),
            part.to_vec(),
            vec![unknown.clone()],
            failed.to_vec(),
            vec![alone.clone()],
        ];
        let published: Vec<Uuid> = groups
            .iter()
            .flatten()
            .map(|e| e.id)
            .filter(|id| *id != failed[1].id)
            .collect();
        let split = split_transactions(&groups, &published, &Runs::new());
        assert_eq!(
            split.ids,
            vec![part[0].id, part[1].id, unknown.id, failed[0].id]
        );
        assert_eq!(split.txids, vec![2, 3, 4]);
        assert!(split.runs.is_empty());
        // Transaction 2 a run from seq 40: kept as such, its events not.
        let runs = Runs::from([(2, (40, 5))]);
        let split = split_transactions(&groups, &published, &runs);
        assert_eq!(split.ids, vec![unknown.id, failed[0].id]);
        assert_eq!(split.txids, vec![2, 3, 4]);
        assert_eq!(split.runs, vec![(2, 40, 5)]);
    }
    use crate::policy::Failure as PublishFailure;

    fn event(aggregate: &str, attempts: i32) -> OutboxEvent {
        OutboxEvent {
            attempts,
            ..OutboxEvent::sample(aggregate)
        }
    }

    fn published() -> Outcome {
        Outcome::Published {
            duplicate: false,
            acked_at: SystemTime::now(),
        }
    }

    fn failed(kind: FailureKind) -> Outcome {
        Outcome::Failed(PublishFailure::new(kind, format!("{kind:?}")))
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 2,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }

    #[test]
    fn merge_of_two_batches_in_flight() {
        let a = BatchReport {
            claimed: 10,
            full: true,
            published: 9,
            failed: 1,
            broker_failures: 0,
            next_retry: Some(Duration::from_secs(4)),
        };
        let b = BatchReport {
            claimed: 3,
            full: false,
            published: 1,
            failed: 2,
            broker_failures: 2,
            next_retry: Some(Duration::from_secs(1)),
        };
        let m = a.merge(b);
        assert_eq!(
            m,
            BatchReport {
                claimed: 10,
                full: true,
                published: 10,
                failed: 3,
                broker_failures: 2,
                next_retry: Some(Duration::from_secs(1)),
            }
        );
        assert_eq!(m, b.merge(a));
        let empty = BatchReport::default();
        assert_eq!(empty.merge(empty), empty);
        assert_eq!(a.merge(empty).next_retry, a.next_retry);
        assert_eq!(empty.merge(b).next_retry, b.next_retry);
    }

    #[test]
    fn settle_records_each_outcome_under_the_policy() {
        let groups = vec![
            vec![event("a", 0), event("a", 0), event("a", 0)],
            vec![event("b", 1)],
            vec![event("c", 0)],
            vec![event("d", 5)],
        ];
        let outcomes = vec![
            vec![
                published(),
                failed(FailureKind::Rejected),
                Outcome::NotAttempted,
            ],
            vec![failed(FailureKind::Rejected)], // second attempt of two: dead
            vec![failed(FailureKind::Timeout)],  // the broker's: no attempt
            vec![failed(FailureKind::Invalid)],  // dead at once
        ];
        let mut seen = Vec::new();
        let s = settle(&policy(), &groups, &outcomes, |settled| {
            seen.push(match settled {
                Settled::Published { event, .. } => (event.id, None),
                Settled::Failed { event, verdict, .. } => (event.id, Some(verdict)),
            })
        });
        assert_eq!(s.published, [groups[0][0].id]);
        let failures: Vec<_> = s
            .failures
            .iter()
            .map(|f| (f.id, f.dead_letter, f.spend_attempt))
            .collect();
        assert_eq!(
            failures,
            [
                (groups[0][1].id, false, true),
                (groups[1][0].id, true, true),
                (groups[2][0].id, false, false),
                (groups[3][0].id, true, true),
            ]
        );
        assert_eq!(s.failures[0].error, "Rejected");
        assert_eq!(seen.len(), 5);
        assert_eq!(
            s.report,
            BatchReport {
                claimed: 0,
                full: false,
                published: 1,
                failed: 4,
                broker_failures: 1,
                next_retry: s.report.next_retry,
            }
        );
        // The first retries (a's rejection after one attempt: 1 s +-25%, the timeout: 1 s) are
        // the earliest; dead letters have none.
        let next = s.report.next_retry.expect("a retry");
        assert!(next >= Duration::from_millis(750) && next <= Duration::from_secs(1));
    }

    #[test]
    fn settle_of_an_all_published_batch() {
        let groups = vec![vec![event("a", 0)], vec![event("b", 0), event("b", 0)]];
        let outcomes = vec![vec![published()], vec![published(), published()]];
        let s = settle(&policy(), &groups, &outcomes, |_| {});
        assert_eq!(s.published.len(), 3);
        assert!(s.failures.is_empty());
        assert_eq!(s.report.next_retry, None);
        assert_eq!(s.report.broker_failures, 0);
    }
}
