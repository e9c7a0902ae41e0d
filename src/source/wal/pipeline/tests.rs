//! The pipeline against a model of the world around it (the outbox table, the broker, the
//! stream), driven through random interleavings of everything that can happen: transactions
//! committing (visible at once or only later), the stream sending them, claims, publishes with
//! failures and broker outages, records that fail, rows held by other sessions, sweeps of the
//! aggregates the table holds, and slot confirmations. After every step: no committed row the slot
//! confirmed past is lost, and per aggregate the first publications follow commit order. At the
//! end, with every trouble gone, everything is published and the slot confirms the last commit.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use proptest::prelude::*;
use uuid::Uuid;

use super::*;

fn key(a: u8) -> AggregateKey {
    ("order".into(), format!("a{a}"))
}

/// One outbox row of the model: `index` is its commit order (and its seq).
#[derive(Debug, Clone)]
struct Row {
    id: Uuid,
    aggregate: u8,
    /// The end position of its transaction's commit.
    end: u64,
    visible: bool,
    streamed: bool,
    /// Published and recorded (or discarded): not pending any more.
    processed: bool,
    /// Locked by another session.
    locked: bool,
    /// Its publish fails (until fixed); a failure records a retry (not eligible until `retried`).
    poison: bool,
    eligible: bool,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// A transaction of 1..=3 rows commits; visible at once or not.
    Commit {
        aggregates: [u8; 3],
        len: u8,
        visible: bool,
        poison: bool,
    },
    /// The oldest transaction not streamed yet streams.
    Stream,
    /// A keepalive.
    Idle,
    /// A committed transaction not visible becomes visible.
    Reveal(u8),
    /// Another session locks or unlocks a row.
    ToggleLock(u8),
    /// A failed row becomes eligible again (its retry is due).
    Retry(u8),
    Cut,
    Claim,
    /// Publish the next batch (`true`: the broker is down for it).
    Publish(bool),
    /// Record the oldest batch (`true`: the record fails).
    Record(bool),
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<[u8; 3]>(), 1u8..=3, any::<bool>(), prop::bool::weighted(0.1)).prop_map(
            |(a, len, visible, poison)| Op::Commit {
                aggregates: [a[0] % 4, a[1] % 4, a[2] % 4],
                len,
                visible,
                poison,
            }
        ),
        4 => Just(Op::Stream),
        1 => Just(Op::Idle),
        3 => any::<u8>().prop_map(Op::Reveal),
        1 => any::<u8>().prop_map(Op::ToggleLock),
        1 => any::<u8>().prop_map(Op::Retry),
        3 => Just(Op::Cut),
        3 => Just(Op::Claim),
        3 => prop::bool::weighted(0.1).prop_map(Op::Publish),
        3 => prop::bool::weighted(0.1).prop_map(Op::Record),
        2 => Just(Op::Sweep),
    ]
}

/// A batch in flight as the driver holds it.
#[derive(Debug)]
struct Batch {
    id: BatchId,
    rows: Vec<Uuid>,
    claimed: bool,
    /// Published: the rows acked and the failures to record, with the aggregates handed over.
    published: Option<(Vec<Uuid>, Vec<Uuid>, Vec<AggregateKey>)>,
}

#[derive(Default)]
struct World {
    rows: Vec<Row>,
    by_id: HashMap<Uuid, usize>,
    /// Transactions committed and not streamed yet: their row indexes.
    unstreamed: VecDeque<Vec<usize>>,
    wal: u64,
    deferred: BTreeSet<AggregateKey>,
    /// First publication of each row, in order.
    log: Vec<usize>,
    first: HashSet<usize>,
    /// Pairs (earlier, later) a sweep published out of commit order because the earlier one was
    /// committed but not visible yet (the table's own limit: it sees only visible rows).
    excused: HashSet<(usize, usize)>,
    confirmed: u64,
    batches: VecDeque<Batch>,
}

impl World {
    fn publish(&mut self, i: usize) {
        if self.first.insert(i) {
            self.log.push(i);
        }
    }

    fn claimable(&self, i: usize) -> bool {
        let r = &self.rows[i];
        r.visible && !r.processed && !r.locked && r.eligible
    }

    fn found(&self, id: &Uuid) -> Found {
        let i = self.by_id[id];
        let r = &self.rows[i];
        if !r.visible {
            Found::NotVisible
        } else if r.processed {
            Found::Done
        } else if self.claimable(i) {
            Found::Claimed
        } else {
            Found::Pending
        }
    }

    /// Publishes groups: a poison row fails and holds back the rest of its group.
    fn broker(&mut self, groups: &[Vec<usize>]) -> (Vec<usize>, Vec<usize>) {
        let (mut acked, mut failed) = (Vec::new(), Vec::new());
        for group in groups {
            for &i in group {
                if self.rows[i].poison {
                    failed.push(i);
                    break;
                }
                self.publish(i);
                acked.push(i);
            }
        }
        (acked, failed)
    }

    fn step(&mut self, p: &mut Pipeline, op: Op) {
        match op {
            Op::Commit {
                aggregates,
                len,
                visible,
                poison,
            } => {
                let mut tx = Vec::new();
                for (n, &aggregate) in aggregates.iter().take(usize::from(len)).enumerate() {
                    let id = Uuid::new_v4();
                    self.by_id.insert(id, self.rows.len());
                    tx.push(self.rows.len());
                    self.rows.push(Row {
                        id,
                        aggregate,
                        end: 0,
                        visible,
                        streamed: false,
                        processed: false,
                        locked: false,
                        poison: poison && n == 0,
                        eligible: true,
                    });
                }
                self.wal += 10;
                for &i in &tx {
                    self.rows[i].end = self.wal;
                }
                self.unstreamed.push_back(tx);
            }
            Op::Stream => {
                if let Some(tx) = self.unstreamed.pop_front() {
                    p.stream(Change::Begin);
                    let mut end = 0;
                    for i in tx {
                        let r = &mut self.rows[i];
                        r.streamed = true;
                        end = r.end;
                        p.stream(Change::Insert(Candidate {
                            id: r.id,
                            aggregate: key(r.aggregate),
                            xid: 1,
                            size: 1,
                            content: None,
                        }));
                    }
                    p.stream(Change::Commit { end });
                }
            }
            Op::Idle => {
                // The server has sent everything committed so far (or nothing is left to send).
                if self.unstreamed.is_empty() {
                    p.stream(Change::Idle { wal_end: self.wal });
                }
            }
            Op::Reveal(n) => {
                let hidden: Vec<usize> = (0..self.rows.len())
                    .filter(|&i| !self.rows[i].visible)
                    .collect();
                if !hidden.is_empty() {
                    // A whole transaction becomes visible at once.
                    let end = self.rows[hidden[usize::from(n) % hidden.len()]].end;
                    for r in self.rows.iter_mut().filter(|r| r.end == end) {
                        r.visible = true;
                    }
                }
            }
            Op::ToggleLock(n) => {
                // Not a row a batch in flight has claimed (locked) itself.
                if !self.rows.is_empty() {
                    let i = usize::from(n) % self.rows.len();
                    let id = self.rows[i].id;
                    if !self
                        .batches
                        .iter()
                        .any(|b| b.claimed && b.rows.contains(&id))
                    {
                        self.rows[i].locked = !self.rows[i].locked;
                    }
                }
            }
            Op::Retry(n) => {
                if !self.rows.is_empty() {
                    let i = usize::from(n) % self.rows.len();
                    self.rows[i].eligible = true;
                }
            }
            Op::Cut => {
                let claiming = self.batches.back().is_some_and(|b| !b.claimed);
                if !claiming && self.batches.len() < 3 {
                    if let Some(cut) = p.cut(4, 4) {
                        self.batches.push_back(Batch {
                            id: cut.batch,
                            rows: cut.rows.iter().map(|c| c.id).collect(),
                            claimed: false,
                            published: None,
                        });
                    }
                }
            }
            Op::Claim => {
                if let Some(b) = self.batches.iter_mut().find(|b| !b.claimed) {
                    b.claimed = true;
                    let (id, ids) = (b.id, b.rows.clone());
                    let found: HashMap<Uuid, Found> =
                        ids.iter().map(|id| (*id, self.found(id))).collect();
                    p.claimed(id, &found, &HashMap::new(), &HashMap::new());
                }
            }
            Op::Publish(outage) => {
                // The oldest batch claimed and not published, once those before it are.
                let Some(at) = self.batches.iter().position(|b| b.published.is_none()) else {
                    return;
                };
                if !self.batches[at].claimed {
                    return;
                }
                let id = self.batches[at].id;
                let groups = p.publish(id);
                for g in &groups {
                    for r in g {
                        assert_eq!(
                            self.found(r),
                            Found::Claimed,
                            "the pipeline publishes a row it did not claim"
                        );
                    }
                }
                if outage {
                    p.failed(id);
                    self.batches.truncate(at);
                    return;
                }
                let groups: Vec<Vec<usize>> = groups
                    .iter()
                    .map(|g| g.iter().map(|id| self.by_id[id]).collect())
                    .collect();
                let (acked, failed) = self.broker(&groups);
                let ids =
                    |v: &[usize]| -> Vec<Uuid> { v.iter().map(|&i| self.rows[i].id).collect() };
                let (acked, failed) = (ids(&acked), ids(&failed));
                let handed = p.settled(id, &acked.iter().copied().collect::<HashSet<_>>());
                self.batches[at].published = Some((acked, failed, handed));
            }
            Op::Record(fails) => {
                let Some(b) = self.batches.front() else {
                    return;
                };
                let Some((acked, failed, handed)) = &b.published else {
                    return;
                };
                let id = b.id;
                if fails {
                    p.failed(id);
                    self.batches.clear();
                    return;
                }
                for a in acked {
                    let i = self.by_id[a];
                    self.rows[i].processed = true;
                }
                for f in failed {
                    let i = self.by_id[f];
                    self.rows[i].eligible = false;
                }
                self.deferred.extend(handed.iter().cloned());
                p.recorded(id);
                self.batches.pop_front();
            }
            Op::Sweep => {
                if !self.batches.is_empty() {
                    return;
                }
                let Some(round) = p.sweep_round(2) else {
                    return;
                };
                let mut back = Vec::new();
                for k in &round.aggregates {
                    assert!(self.deferred.contains(k), "swept {k:?}, not with the table");
                    let pending: Vec<usize> = (0..self.rows.len())
                        .filter(|&i| {
                            let r = &self.rows[i];
                            key(r.aggregate) == *k && r.visible && !r.processed
                        })
                        .collect();
                    if pending.is_empty() {
                        back.push(k.clone());
                        continue;
                    }
                    if round.frozen.contains(k) {
                        continue;
                    }
                    let mut all = true;
                    for &i in &pending {
                        if !self.claimable(i) || self.rows[i].poison {
                            if self.rows[i].poison && self.claimable(i) {
                                self.rows[i].eligible = false;
                            }
                            all = false;
                            break;
                        }
                        // Rows of this aggregate committed before it and not visible: the table
                        // cannot see them (the table source's limit too).
                        for j in 0..i {
                            let r = &self.rows[j];
                            if key(r.aggregate) == *k && !r.visible {
                                self.excused.insert((j, i));
                            }
                        }
                        self.publish(i);
                        self.rows[i].processed = true;
                    }
                    if all {
                        back.push(k.clone());
                    }
                }
                for k in &back {
                    self.deferred.remove(k);
                }
                p.taken_back(&back);
            }
        }
        if let Some(position) = p.confirm() {
            assert!(position >= self.confirmed);
            self.confirmed = position;
        }
        self.check(p);
    }

    /// After every step.
    fn check(&self, p: &Pipeline) {
        // Nothing the slot confirmed past is lost: each such row is processed, or pending and
        // visible in the table with its aggregate held by the table.
        for (i, r) in self.rows.iter().enumerate() {
            if r.end <= self.confirmed && r.streamed {
                let with_table = r.visible && self.deferred.contains(&key(r.aggregate));
                assert!(
                    r.processed || with_table,
                    "row {i} ({r:?}) lost: the slot confirmed {} past it",
                    self.confirmed
                );
            }
        }
        // The pipeline's idea of the table's aggregates is the table's.
        assert_eq!(p.held(), &self.deferred);
        // First publications per aggregate in commit order.
        let mut last: HashMap<u8, usize> = HashMap::new();
        for &i in &self.log {
            let a = self.rows[i].aggregate;
            if let Some(prev) = last.insert(a, i) {
                assert!(
                    prev < i || self.excused.contains(&(i, prev)),
                    "aggregate {a}: row {i} published after row {prev}; log {:?}",
                    self.log
                );
            }
        }
    }

    /// Every trouble gone: drives the pipeline until nothing is left.
    fn settle_all(&mut self, p: &mut Pipeline) {
        for r in &mut self.rows {
            r.visible = true;
            r.locked = false;
            r.poison = false;
            r.eligible = true;
        }
        for _ in 0..500 {
            let done = self.unstreamed.is_empty()
                && self.batches.is_empty()
                && p.in_flight() == 0
                && p.held().is_empty()
                && self.confirmed == self.wal
                && self.rows.iter().all(|r| r.processed);
            if done {
                break;
            }
            // Failures recorded by batches published before: their retries come due.
            for r in &mut self.rows {
                r.eligible = true;
            }
            for op in [
                Op::Stream,
                Op::Record(false),
                Op::Publish(false),
                Op::Claim,
                Op::Cut,
                Op::Sweep,
                Op::Idle,
            ] {
                self.step(p, op);
            }
        }
        assert!(self.unstreamed.is_empty());
        for (i, r) in self.rows.iter().enumerate() {
            assert!(r.processed, "row {i} never published: {r:?}");
        }
        assert!(p.held().is_empty(), "aggregates left with the table");
        assert_eq!(p.in_flight(), 0);
        assert_eq!(
            self.confirmed, self.wal,
            "the slot confirms the last commit"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn the_pipeline_loses_and_reorders_nothing(ops in prop::collection::vec(op(), 0..120)) {
        let mut world = World::default();
        let mut p = Pipeline::new([]);
        for op in ops {
            world.step(&mut p, op);
        }
        world.settle_all(&mut p);
    }
}

/// The two defects found by careful operators, as unit tests of the pipeline.
#[test]
fn a_row_not_visible_is_carried_while_its_aggregate_goes_to_the_table_and_back() {
    let mut p = Pipeline::new([key(0)]);
    let row = Candidate {
        id: Uuid::new_v4(),
        aggregate: key(0),
        xid: 1,
        size: 1,
        content: None,
    };
    p.stream(Change::Begin);
    p.stream(Change::Insert(row.clone()));
    p.stream(Change::Commit { end: 10 });
    let cut = p.cut(10, 10).expect("a batch");
    p.claimed(
        cut.batch,
        &HashMap::from([(row.id, Found::NotVisible)]),
        &HashMap::new(),
        &HashMap::new(),
    );
    assert!(p.publish(cut.batch).is_empty());
    assert!(p.settled(cut.batch, &HashSet::new()).is_empty());
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), None, "the slot waits for the row");
    // The table has no pending row of the aggregate: it goes back to the stream, frozen (the
    // stream holds a row of it).
    let round = p.sweep_round(10).expect("a round");
    assert!(round.frozen.contains(&key(0)));
    p.taken_back(&round.aggregates);
    // Visible now: it goes out from the stream.
    let cut = p.cut(10, 10).expect("claimed again");
    p.claimed(
        cut.batch,
        &HashMap::from([(row.id, Found::Claimed)]),
        &HashMap::new(),
        &HashMap::new(),
    );
    assert_eq!(p.publish(cut.batch), [vec![row.id]]);
    p.settled(cut.batch, &HashSet::from([row.id]));
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), Some(10));
}

#[test]
fn a_carried_row_keeps_the_slot_waiting_only_until_it_is_resolved() {
    let mut p = Pipeline::new([]);
    let rows: Vec<Candidate> = (0..2)
        .map(|_| Candidate {
            id: Uuid::new_v4(),
            aggregate: key(0),
            xid: 1,
            size: 1,
            content: None,
        })
        .collect();
    for (n, r) in rows.iter().enumerate() {
        p.stream(Change::Begin);
        p.stream(Change::Insert(r.clone()));
        p.stream(Change::Commit {
            end: 10 * (n as u64 + 1),
        });
    }
    // The first fails (its aggregate goes to the table), the second is not visible yet.
    let cut = p.cut(10, 10).expect("a batch");
    p.claimed(
        cut.batch,
        &HashMap::from([
            (rows[0].id, Found::Claimed),
            (rows[1].id, Found::NotVisible),
        ]),
        &HashMap::new(),
        &HashMap::new(),
    );
    assert_eq!(p.publish(cut.batch), [vec![rows[0].id]]);
    assert_eq!(p.settled(cut.batch, &HashSet::new()), [key(0)]);
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), Some(10), "the first is with the table");
    // Visible now, its aggregate with the table: the table takes it; the slot moves on.
    let cut = p.cut(10, 10).expect("claimed again");
    p.claimed(
        cut.batch,
        &HashMap::from([(rows[1].id, Found::Claimed)]),
        &HashMap::new(),
        &HashMap::new(),
    );
    assert!(p.publish(cut.batch).is_empty());
    p.settled(cut.batch, &HashSet::new());
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), Some(20));
}
