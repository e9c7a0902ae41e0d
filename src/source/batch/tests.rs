use std::time::SystemTime;

use super::settle::Settled;
use super::*;
use crate::event::OutboxEvent;
use crate::policy::FailureKind;
use crate::source::store::Runs;

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
