//! `--transactions atomic`: the rows a completion takes keep the stream's order.

use super::*;
use crate::source::store::CommitOrder;

/// Streams `transactions` (their rows), the n-th (from 1) committing at 10 n.
fn stream_transactions(p: &mut Pipeline, transactions: &[&[&Candidate]]) {
    for (n, rows) in transactions.iter().enumerate() {
        p.stream(Change::Begin);
        for r in *rows {
            p.stream(Change::Insert((*r).clone()));
        }
        p.stream(Change::Commit {
            end: 10 * (n as u64 + 1),
        });
    }
}

/// `--transactions atomic`: the rows a completion takes from the table keep the stream's order. Q
/// (aggregate 1) is streamed and not visible; then T = {A (aggregate 0), U (aggregate 1)}. The
/// claim holds A and takes U: U waits for Q (streamed before it, so committed before it), which
/// the completion's own check cannot see. A row the stream has not brought waits unless the
/// table holds its aggregate. Once Q is published (acked, not even recorded) or in the claim, U
/// may go, placed after Q.
#[test]
fn rows_a_completion_takes_wait_for_what_the_stream_brought_before_them() {
    let (q, a, u) = (row(1), row(0), row(1));
    let mut p = Pipeline::new([key(3)]);
    stream_transactions(&mut p, &[&[&q], &[&a, &u]]);
    let cut = p.cut(10, 10).expect("a batch");
    let found = HashMap::from([
        (q.id, Found::NotVisible),
        (a.id, Found::Claimed),
        (u.id, Found::Claimed),
    ]);
    p.claimed(cut.batch, &found, &HashMap::new(), &HashMap::new(), 0);
    assert_eq!(p.publish(cut.batch), [vec![a.id]], "U carried behind Q");
    let claim: HashSet<Uuid> = HashSet::from([a.id]);
    let order = p.taken(&claim, &[(u.id, &key(1))]);
    assert!(order.wait.contains(&u.id), "U waits for Q");
    let (unknown, with_table) = (Uuid::new_v4(), Uuid::new_v4());
    let order = p.taken(&claim, &[(unknown, &key(2)), (with_table, &key(3))]);
    assert!(
        order.wait.contains(&unknown),
        "not brought by the stream yet"
    );
    assert!(!order.wait.contains(&with_table), "the table's order");
    // T postponed: A is not published, its aggregate goes to the table.
    assert_eq!(p.settled(cut.batch, &HashSet::new()), [key(0)]);
    p.recorded(cut.batch);

    // Q visible now, claimed (with U, which went back to the queue): Q in its own batch first.
    let first = p.cut(1, 10).expect("Q");
    assert_eq!(first.rows[0].id, q.id);
    let second = p.cut(1, 10).expect("U");
    let found = HashMap::from([(q.id, Found::Claimed), (u.id, Found::Claimed)]);
    p.claimed(first.batch, &found, &HashMap::new(), &HashMap::new(), 0);
    p.claimed(second.batch, &found, &HashMap::new(), &HashMap::new(), 0);
    assert_eq!(p.publish(first.batch), [vec![q.id]]);
    // A claim of the table holding A (aggregate 0, with the table) takes U: Q is still to be
    // acked, U waits; acked, U may go.
    let from_table = HashSet::from([a.id]);
    assert!(p
        .taken(&from_table, &[(u.id, &key(1))])
        .wait
        .contains(&u.id));
    p.settled(first.batch, &HashSet::from([q.id]));
    assert!(p.taken(&from_table, &[(u.id, &key(1))]).wait.is_empty());
    // U's own claim takes A from the table: nothing streamed of aggregate 0 waits.
    assert_eq!(p.publish(second.batch), [vec![u.id]]);
    let order = p.taken(&HashSet::from([u.id]), &[(a.id, &key(0))]);
    assert!(order.wait.is_empty());

    // A claim that holds the earlier row: the taken row goes after it, in stream order.
    let (x, t, v) = (row(1), row(0), row(1));
    let mut p = Pipeline::new([]);
    stream_transactions(&mut p, &[&[&x], &[&v, &t]]);
    let order = p.taken(&HashSet::from([x.id, t.id]), &[(v.id, &key(1))]);
    assert!(order.wait.is_empty());
    assert!(order.position[&x.id] < order.position[&v.id]);
    let order = p.taken(&HashSet::from([t.id]), &[(v.id, &key(1))]);
    assert!(order.wait.contains(&v.id), "X is neither claimed nor taken");
}
