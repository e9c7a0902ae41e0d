//! A batch's outcomes settled under the retry policy, and the transactions it did not publish
//! whole: pure, unit-tested (`tests.rs`).

use std::time::SystemTime;

use uuid::Uuid;

use super::{earliest, BatchReport};
use crate::event::OutboxEvent;
use crate::policy::Outcome;
use crate::policy::{FailureKind, RetryPolicy, Verdict};
use crate::source::store::{Failure, Runs, Split};

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
/// `observe` about each event settled. Put-back events (an earlier one of their aggregate failed)
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
