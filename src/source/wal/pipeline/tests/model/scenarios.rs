//! The scenarios operators reproduced on the relay (issue 45), as steps of the model, and a
//! dead letter served by the next sweep round among thousands blocked.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::runs::config;
use super::*;

/// Steps of the model, for the scenarios operators reproduced on the relay (issue 45).
fn steps(w: &mut World, p: &mut Pipeline, ops: &[Op]) {
    for op in ops {
        w.step(p, *op);
    }
}

/// A transaction of `len` rows of aggregate `a`, visible, the first poison or not.
fn commit(a: u32, len: u8, poison: bool) -> Op {
    Op::Commit {
        aggregates: [a; 3],
        len,
        visible: true,
        poison,
        skipped: false,
    }
}

/// A batch cut, claimed, published and recorded.
const BATCH: [Op; 4] = [Op::Cut, Op::Claim, Op::Publish(false), Op::Record(false)];

/// A stream busy with one transaction larger than the read-ahead (issue 45, item 1): writer 1
/// inserts LOW (row 0) for aggregate 0 and stays open, writer 2 commits HIGH (row 1) for it, a
/// batch job commits ten rows of other aggregates in one transaction, writer 1 commits. HIGH waits
/// for LOW (committed after it) while the stream brings the batch job's rows, a few at a time,
/// with no commit for long: HIGH then LOW, in commit order, never with the table (seq order).
#[test]
fn the_model_keeps_commit_order_through_a_stream_busy_with_one_large_transaction() {
    let (mut w, mut p) = (World::new(ALL), Pipeline::new([]));
    let big = Op::Big {
        aggregates: [1, 2],
        len: 10,
        visible: true,
    };
    steps(&mut w, &mut p, &[Op::Open(0), commit(0, 1, false), big]);
    steps(&mut w, &mut p, &[Op::CommitOpen(0, true), Op::Stream]);
    steps(&mut w, &mut p, &BATCH);
    for _ in 0..3 {
        steps(&mut w, &mut p, &[Op::StreamSome(3)]);
        steps(&mut w, &mut p, &BATCH);
        steps(&mut w, &mut p, &[Op::Sweep, Op::Sweep]);
    }
    assert!(w.deferred.is_empty(), "nothing to the table");
    assert_eq!(w.first.len(), 9, "the batch job's rows streamed go out");
    w.settle_all(&mut p);
    let a: Vec<usize> = (w.log.iter())
        .filter(|(_, a)| *a == 0)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(a, [1, 0], "HIGH, LOW: commit order");
}

/// Three writers of one aggregate: W0 and W1 insert (seq 0 and 1) and stay open, H (seq 2)
/// commits, W0 commits, H is claimed (W0 visible: it waits for it), W1 commits, the stream brings
/// W0. Claimed again, H has another older row the stream has not brought, W1, committed after
/// the position H first waited for: the stream passing that position proves nothing of W1. So H
/// waits for W1 too, and all three go out in commit order, H, W0, W1 (before, the table took the
/// aggregate and published them in seq order).
#[test]
fn the_model_keeps_commit_order_with_three_writers_committing_out_of_seq_order() {
    let (mut w, mut p) = (World::new(ALL), Pipeline::new([]));
    steps(
        &mut w,
        &mut p,
        &[Op::Open(0), Op::Open(0), commit(0, 1, false)],
    );
    steps(&mut w, &mut p, &[Op::CommitOpen(0, true), Op::Stream]);
    steps(&mut w, &mut p, &BATCH);
    steps(&mut w, &mut p, &[Op::CommitOpen(0, true), Op::Stream]);
    steps(&mut w, &mut p, &BATCH);
    assert!(w.deferred.is_empty(), "nothing to the table");
    w.settle_all(&mut p);
    let a: Vec<usize> = (w.log.iter())
        .filter(|(_, a)| *a == 0)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(a, [2, 0, 1], "H, W0, W1: commit order");
}

/// Rows moved by hand while their aggregate is swept (issue 45, item 6): aggregate 0 is with the
/// table behind a dead head (row 0) that an operator discards; a sweep round reads its rows, a
/// script moves the oldest (row 1) to aggregate 1, the round's claim finds it moved: aggregate 1
/// is recorded as deferred and served (memory learns it), without a restart.
#[test]
fn the_model_serves_rows_moved_while_their_aggregate_is_swept() {
    let (mut w, mut p) = (World::new(ALL), Pipeline::new([]));
    steps(&mut w, &mut p, &[commit(0, 3, true), Op::Stream]);
    steps(&mut w, &mut p, &BATCH);
    steps(&mut w, &mut p, &[Op::Retry(0), Op::Sweep, Op::Sweep]);
    assert!(w.rows[0].dead, "the head failed twice");
    steps(&mut w, &mut p, &[Op::Discard(0), Op::Sweep, Op::Move(0, 1)]);
    assert_eq!(w.rows[1].aggregate, 1, "moved while the round runs");
    steps(&mut w, &mut p, &[Op::Sweep]);
    assert!(
        w.deferred.contains(&key(1)),
        "the round's claim found it moved"
    );
    steps(&mut w, &mut p, &[Op::Sweep, Op::Sweep]);
    assert!(
        w.first.contains(&1) && w.first.contains(&2),
        "served without a restart"
    );
    w.settle_all(&mut p);
}

/// A relay (re)started with `n` aggregates blocked behind dead letters (a row behind each), as an
/// earlier relay left them: every commit resolved, the heads dead, their aggregates recorded as
/// deferred, the slot past them.
fn blocked_backlog(n: u32) -> (World, Pipeline) {
    let mut w = World::new(ALL);
    w.round = 100;
    for a in 0..n {
        let (head, tail) = (w.insert(a, true), w.insert(a, false));
        w.commit(vec![head, tail], true, false);
        let h = &mut w.rows[head];
        (h.attempts, h.dead, h.eligible) = (ATTEMPTS, true, false);
        w.troubled.insert(a);
        w.deferred.insert(key(a));
    }
    for r in &mut w.rows {
        r.streamed = true;
    }
    (w.confirmed, w.next_tx) = (w.wal, w.txs.len());
    let mut p = Pipeline::new([]);
    w.step(&mut p, Op::Restart);
    (w, p)
}

proptest! {
    #![proptest_config(config(8))]

    /// Thousands of aggregates blocked behind dead letters: a dead letter an operator retries
    /// (its cause fixed) or discards, wherever its aggregate stands in the key order and wherever
    /// the rounds stand, is served by the very next sweep round (100 aggregates a round): the
    /// retried one and the row behind it published, the discarded one never, the row behind it
    /// published; the others stay blocked.
    #[test]
    fn a_retried_or_discarded_dead_letter_goes_in_the_next_round_among_thousands_blocked(
        n in 200u32..3_000,
        rounds_before in 0usize..40,
        retried in prop::collection::btree_set(any::<u32>(), 1..8),
        discarded in prop::collection::btree_set(any::<u32>(), 0..4),
    ) {
        let (mut w, mut p) = blocked_backlog(n);
        for _ in 0..rounds_before {
            w.step(&mut p, Op::Sweep);
        }
        if w.sweeping.is_some() {
            w.step(&mut p, Op::Sweep);
        }
        let retried: BTreeSet<u32> = retried.iter().map(|a| a % n).collect();
        let discarded: BTreeSet<u32> =
            discarded.iter().map(|a| a % n).filter(|a| !retried.contains(a)).collect();
        // Row 2a is aggregate a's head, 2a + 1 the row behind it.
        let row = |a: u32| usize::try_from(a).unwrap_or(usize::MAX) * 2;
        for &a in &retried {
            w.retry_dead(row(a), true);
        }
        for &a in &discarded {
            w.discard(row(a));
        }
        // The notification: a round, read and claimed.
        w.step(&mut p, Op::Sweep);
        w.step(&mut p, Op::Sweep);
        for a in 0..n {
            let (head, tail) = (w.first.contains(&row(a)), w.first.contains(&(row(a) + 1)));
            if retried.contains(&a) {
                prop_assert!(head && tail, "retried dead letter of {a} not out in the round");
                prop_assert!(!w.deferred.contains(&key(a)), "{a} not undeferred");
            } else if discarded.contains(&a) {
                prop_assert!(!head && tail, "the row behind the discarded {a} not out");
                prop_assert!(!w.deferred.contains(&key(a)), "{a} not undeferred");
            } else {
                prop_assert!(!head && !tail, "{a} went out, blocked");
            }
        }
    }
}
