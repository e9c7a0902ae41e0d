//! The pipeline against a model of the world around it (the outbox table, the broker, the
//! stream, the slot and the process itself), driven through random interleavings of everything
//! that can happen: transactions committing (visible at once or only later, or in no stream: a
//! publication that left the table out for a moment), the stream sending them, claims, publishes
//! with failures and broker outages, records that fail, rows held by other sessions, rows moved to
//! another aggregate or deleted by hand after their commit, retries falling due, sweeps of the
//! aggregates the table holds (chosen from the durable record, those behind a dead head skipped
//! until an operator's retry), the stream's fallback, and crashes: the relay restarting (or
//! another one taking over) with only what is durable (the rows, `outbox_wal_deferred`, the
//! slot's confirmed position, what the broker stored), its pipeline rebuilt from the database and
//! the stream sent again from the confirmed position.
//!
//! After every step: nothing the slot confirmed past is known only in memory (each such streamed
//! row is published, or pending and visible with its aggregate recorded as held by the table);
//! the pipeline's held aggregates are the recorded ones; and per aggregate the first publications
//! follow commit order. At the end, with every trouble gone, every row is published (the ones no
//! stream carried too), no aggregate is left with the table and the slot confirms the last commit.

use std::collections::{BTreeSet, HashMap, HashSet};

use proptest::prelude::*;
use uuid::Uuid;

use super::*;
use crate::source::wal::control::Scan;
use crate::source::wal::fallback::suspects;

fn key(a: u8) -> AggregateKey {
    ("order".into(), format!("a{a}"))
}

/// A new streamed row of aggregate `agg`.
fn row(agg: u8) -> Candidate {
    Candidate {
        transaction: None,
        id: Uuid::new_v4(),
        aggregate: key(agg),
        xid: 1,
        size: 1,
        content: None,
    }
}

/// One outbox row of the model: `index` is its commit order (and its seq).
#[derive(Debug, Clone)]
struct Row {
    id: Uuid,
    /// Its aggregate now.
    aggregate: u8,
    /// Its aggregate as inserted: what the stream carries.
    inserted_as: u8,
    /// The end position of its transaction's commit.
    end: u64,
    visible: bool,
    streamed: bool,
    /// In no stream (committed while the publication left the table out).
    skipped: bool,
    /// Published and recorded: not pending any more.
    processed: bool,
    /// Deleted by hand (nothing to publish).
    deleted: bool,
    /// Locked by another session.
    locked: bool,
    /// Its publish fails (until fixed); a failure records a retry (not eligible until `retried`).
    poison: bool,
    eligible: bool,
    /// Moved to another aggregate by hand (after the log had this many entries).
    moved_at: Option<usize>,
}

impl Row {
    fn pending(&self) -> bool {
        self.visible && !self.processed && !self.deleted
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// A transaction of 1..=3 rows commits; visible at once or not; or in no stream (visible).
    Commit {
        aggregates: [u8; 3],
        len: u8,
        visible: bool,
        poison: bool,
        skipped: bool,
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
    /// A row is moved to another aggregate by hand.
    Move(u8, u8),
    /// A row is deleted by hand.
    Delete(u8),
    Cut,
    Claim,
    /// Publish the next batch (`true`: the broker is down for it).
    Publish(bool),
    /// Record the oldest batch (`true`: the record fails).
    Record(bool),
    Sweep,
    /// A look of the stream's fallback.
    Fallback,
    /// The relay dies and starts again (or another one takes over): only what is durable stays.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            any::<[u8; 3]>(),
            1u8..=3,
            any::<bool>(),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.08)
        )
            .prop_map(|(a, len, visible, poison, skipped)| Op::Commit {
                aggregates: [a[0] % 4, a[1] % 4, a[2] % 4],
                len,
                visible: visible || skipped,
                poison,
                skipped,
            }),
        4 => Just(Op::Stream),
        1 => Just(Op::Idle),
        3 => any::<u8>().prop_map(Op::Reveal),
        1 => any::<u8>().prop_map(Op::ToggleLock),
        1 => any::<u8>().prop_map(Op::Retry),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(n, to)| Op::Move(n, to % 4)),
        1 => any::<u8>().prop_map(Op::Delete),
        3 => Just(Op::Cut),
        3 => Just(Op::Claim),
        3 => prop::bool::weighted(0.1).prop_map(Op::Publish),
        3 => prop::bool::weighted(0.1).prop_map(Op::Record),
        2 => Just(Op::Sweep),
        1 => Just(Op::Fallback),
        1 => Just(Op::Restart),
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

/// Which defences the pipeline under test has (all of them but in the runs that show what each
/// one is for).
#[derive(Debug, Clone, Copy)]
struct Defences {
    /// Aggregates found held at start are recorded (deferred.sql).
    record_at_start: bool,
    /// The claim reports rows behind an older pending row (`prev`) and moved rows.
    claim_checks: bool,
    /// The stream's fallback runs.
    fallback: bool,
}

const ALL: Defences = Defences {
    record_at_start: true,
    claim_checks: true,
    fallback: true,
};

struct World {
    defences: Defences,
    rows: Vec<Row>,
    by_id: HashMap<Uuid, usize>,
    /// Every transaction committed, in commit order: its rows.
    txs: Vec<Vec<usize>>,
    /// The next transaction the stream sends.
    next_tx: usize,
    wal: u64,
    /// `outbox_wal_deferred`.
    deferred: BTreeSet<AggregateKey>,
    /// First publication of each row, in order, with its aggregate then.
    log: Vec<(usize, u8)>,
    first: HashSet<usize>,
    /// Pairs (earlier, later) a sweep published out of commit order because the earlier one was
    /// committed but not visible yet (the table's own limit: it sees only visible rows).
    excused: HashSet<(usize, usize)>,
    /// The slot's confirmed position (durable).
    confirmed: u64,
    batches: VecDeque<Batch>,
    /// The fallback's last look.
    scan: Option<Scan>,
}

impl World {
    fn new(defences: Defences) -> World {
        World {
            defences,
            rows: Vec::new(),
            by_id: HashMap::new(),
            txs: Vec::new(),
            next_tx: 0,
            wal: 0,
            deferred: BTreeSet::new(),
            log: Vec::new(),
            first: HashSet::new(),
            excused: HashSet::new(),
            confirmed: 0,
            batches: VecDeque::new(),
            scan: None,
        }
    }

    fn publish(&mut self, i: usize) {
        if self.first.insert(i) {
            self.log.push((i, self.rows[i].aggregate));
        }
    }

    fn claimable(&self, i: usize) -> bool {
        let r = &self.rows[i];
        r.pending() && !r.locked && r.eligible
    }

    /// What the claim of one candidate finds, as the claim statements see the table: moved rows
    /// and rows behind an older pending row of their aggregate are reported with the claim.
    fn found(&self, id: &Uuid) -> (Found, Option<AggregateKey>, Option<Uuid>) {
        let i = self.by_id[id];
        let r = &self.rows[i];
        if !r.visible {
            (Found::NotVisible, None, None)
        } else if r.processed || r.deleted {
            (Found::Done, None, None)
        } else if !self.claimable(i) {
            (Found::Pending, None, None)
        } else if !self.defences.claim_checks {
            (Found::Claimed, None, None)
        } else if r.aggregate != r.inserted_as {
            (Found::Pending, Some(key(r.aggregate)), None)
        } else {
            let prev = (0..i)
                .rev()
                .find(|&j| self.rows[j].pending() && self.rows[j].aggregate == r.aggregate)
                .map(|j| self.rows[j].id);
            (Found::Claimed, None, prev)
        }
    }

    /// A row that a batch in flight has claimed (locked): others wait for it.
    fn in_claimed_batch(&self, i: usize) -> bool {
        let id = self.rows[i].id;
        self.batches
            .iter()
            .any(|b| b.claimed && b.rows.contains(&id))
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
                skipped,
            } => {
                let mut tx = Vec::new();
                self.wal += 10;
                for (n, &aggregate) in aggregates.iter().take(usize::from(len)).enumerate() {
                    let id = Uuid::new_v4();
                    self.by_id.insert(id, self.rows.len());
                    tx.push(self.rows.len());
                    self.rows.push(Row {
                        id,
                        aggregate,
                        inserted_as: aggregate,
                        end: self.wal,
                        visible,
                        streamed: false,
                        skipped,
                        processed: false,
                        deleted: false,
                        locked: false,
                        poison: poison && n == 0,
                        eligible: true,
                        moved_at: None,
                    });
                }
                self.txs.push(tx);
            }
            Op::Stream => {
                // A transaction in no stream: the stream's position moves past it unseen.
                while self
                    .txs
                    .get(self.next_tx)
                    .is_some_and(|tx| self.rows[tx[0]].skipped)
                {
                    self.next_tx += 1;
                }
                if let Some(tx) = self.txs.get(self.next_tx).cloned() {
                    self.next_tx += 1;
                    p.stream(Change::Begin);
                    let mut end = 0;
                    for i in tx {
                        let r = &mut self.rows[i];
                        r.streamed = true;
                        end = r.end;
                        p.stream(Change::Insert(Candidate {
                            transaction: None,
                            id: r.id,
                            aggregate: key(r.inserted_as),
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
                let sent = self.txs[self.next_tx..]
                    .iter()
                    .all(|tx| self.rows[tx[0]].skipped);
                if sent {
                    self.next_tx = self.txs.len();
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
                    if !self.in_claimed_batch(i) {
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
            Op::Move(n, to) => {
                // An UPDATE waits for a batch's lock: only rows no batch in flight holds.
                if !self.rows.is_empty() {
                    let i = usize::from(n) % self.rows.len();
                    let r = &self.rows[i];
                    if r.pending() && r.aggregate != to && !self.in_claimed_batch(i) {
                        let at = self.log.len();
                        let r = &mut self.rows[i];
                        r.aggregate = to;
                        r.moved_at = Some(at);
                    }
                }
            }
            Op::Delete(n) => {
                if !self.rows.is_empty() {
                    let i = usize::from(n) % self.rows.len();
                    if self.rows[i].visible && !self.in_claimed_batch(i) {
                        self.rows[i].deleted = true;
                    }
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
                if let Some(at) = self.batches.iter().position(|b| !b.claimed) {
                    let (id, ids) = (self.batches[at].id, self.batches[at].rows.clone());
                    let (mut found, mut moved, mut prev) =
                        (HashMap::new(), HashMap::new(), HashMap::new());
                    for row in &ids {
                        let (f, m, b) = self.found(row);
                        found.insert(*row, f);
                        if let Some(m) = m {
                            moved.insert(*row, m);
                        }
                        if let Some(b) = b {
                            prev.insert(*row, b);
                        }
                    }
                    self.batches[at].claimed = true;
                    p.claimed(id, &found, &moved, &prev, self.wal);
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
                        assert!(
                            self.claimable(self.by_id[r]),
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
            Op::Sweep => self.sweep(p),
            Op::Fallback => self.fallback(p),
            Op::Restart => {
                // Batches in flight roll back; the stream goes again from the slot's position;
                // the new pipeline knows what the database says is held.
                self.batches.clear();
                let found: Vec<AggregateKey> = self
                    .rows
                    .iter()
                    .filter(|r| r.pending() && !r.eligible)
                    .map(|r| key(r.aggregate))
                    .collect();
                let mut held = self.deferred.clone();
                held.extend(found);
                if self.defences.record_at_start {
                    self.deferred.clone_from(&held);
                }
                *p = Pipeline::new(held);
                self.next_tx = self
                    .txs
                    .iter()
                    .position(|tx| self.rows[tx[0]].end > self.confirmed)
                    .unwrap_or(self.txs.len());
                for tx in &self.txs[self.next_tx..] {
                    for &i in tx {
                        self.rows[i].streamed = false;
                    }
                }
                self.scan = None;
            }
        }
        if let Some(position) = p.confirm() {
            self.confirmed = self.confirmed.max(position);
        }
        self.check(p);
    }

    fn sweep(&mut self, p: &mut Pipeline) {
        if !self.batches.is_empty() {
            return;
        }
        // The durable record decides what a round serves (`sweep_round.sql`): up to 2 aggregates
        // after the cursor, going round, skipping those whose oldest pending row may not go (a
        // dead letter: an operator's retry, `Op::Retry`, makes it servable in the next round).
        let cursor = p.cursor();
        let blocked = |k: &AggregateKey| {
            (0..self.rows.len())
                .find(|&i| key(self.rows[i].aggregate) == *k && self.rows[i].pending())
                .is_some_and(|i| !self.rows[i].eligible)
        };
        let servable: Vec<&AggregateKey> = self.deferred.iter().filter(|k| !blocked(k)).collect();
        let chosen: Vec<AggregateKey> = servable
            .iter()
            .filter(|k| ***k > cursor)
            .chain(servable.iter().filter(|k| ***k <= cursor))
            .take(2)
            .map(|k| (*k).clone())
            .collect();
        let round = p.serve(chosen);
        let mut back = Vec::new();
        for k in &round.aggregates {
            assert!(self.deferred.contains(k), "swept {k:?}, not with the table");
            let pending: Vec<usize> = (0..self.rows.len())
                .filter(|&i| key(self.rows[i].aggregate) == *k && self.rows[i].pending())
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
                // Rows of this aggregate committed before it and not visible: the table cannot
                // see them (the table source's limit too).
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

    /// The stream's fallback (`fallback.rs`): a look waits until the slot has passed its position;
    /// then the rows it noted that the pipeline neither holds nor left to the table, still pending
    /// and publishable, hand their aggregates to the table; then the next look.
    fn fallback(&mut self, p: &mut Pipeline) {
        if !self.defences.fallback {
            return;
        }
        if let Some(scan) = self.scan.take() {
            if p.confirmed() < scan.lsn {
                self.scan = Some(scan);
                return;
            }
            let keys: BTreeSet<AggregateKey> = suspects(&scan, p)
                .iter()
                .map(|id| self.by_id[id])
                .filter(|&i| self.rows[i].pending() && self.rows[i].eligible)
                .map(|i| key(self.rows[i].aggregate))
                .collect();
            self.deferred.extend(keys.iter().cloned());
            p.hand_over(keys);
        }
        // Per aggregate not held, its oldest pending row, when it may go now.
        let mut rows = Vec::new();
        for a in 0..4 {
            if self.deferred.contains(&key(a)) {
                continue;
            }
            let oldest = (0..self.rows.len())
                .find(|&i| self.rows[i].aggregate == a && self.rows[i].pending());
            if let Some(i) = oldest.filter(|&i| self.rows[i].eligible) {
                rows.push((self.rows[i].id, key(a)));
            }
        }
        if !rows.is_empty() {
            self.scan = Some(Scan {
                lsn: self.wal,
                rows,
                next: None,
            });
        }
    }

    /// After every step.
    fn check(&self, p: &Pipeline) {
        // Nothing the slot confirmed past is known only in memory: each such streamed row is
        // processed, or pending and visible in the table with its aggregate held by the table
        // (rows changed by hand after their commit are the fallback's to find).
        for (i, r) in self.rows.iter().enumerate() {
            if r.end <= self.confirmed && r.streamed && r.moved_at.is_none() && !r.deleted {
                let with_table = r.visible && self.deferred.contains(&key(r.aggregate));
                assert!(
                    r.processed || with_table,
                    "row {i} ({r:?}) lost: the slot confirmed {} past it",
                    self.confirmed
                );
            }
        }
        // The pipeline's idea of the table's aggregates is the table's.
        assert_eq!(
            p.held(),
            &self.deferred,
            "aggregates held by the table in memory only"
        );
        // First publications per aggregate in commit order, among the rows written as they are.
        // A row moved to another aggregate by hand joins that aggregate's order when the claim
        // sees the move (it goes to the table, both aggregates with it), but not against rows
        // claimed before the move committed, nor behind rows already out: those pairs are not
        // checked (the model checks that it is published, and that nothing is lost).
        let mut last: HashMap<u8, usize> = HashMap::new();
        for &(i, a) in &self.log {
            if let Some(prev) = last.insert(a, i) {
                let moved = self.rows[i].moved_at.is_some() || self.rows[prev].moved_at.is_some();
                assert!(
                    prev < i || self.excused.contains(&(i, prev)) || moved,
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
            let done = self.next_tx == self.txs.len()
                && self.batches.is_empty()
                && p.in_flight() == 0
                && p.held().is_empty()
                && self.confirmed == self.wal
                && self.rows.iter().all(|r| r.processed || r.deleted);
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
                Op::Fallback,
            ] {
                self.step(p, op);
            }
        }
        assert_eq!(self.next_tx, self.txs.len());
        for (i, r) in self.rows.iter().enumerate() {
            assert!(r.processed || r.deleted, "row {i} never published: {r:?}");
        }
        assert!(p.held().is_empty(), "aggregates left with the table");
        assert_eq!(p.in_flight(), 0);
        assert_eq!(
            self.confirmed, self.wal,
            "the slot confirms the last commit"
        );
    }
}

/// Runs `ops` then settles, with `defences`.
fn run(defences: Defences, ops: Vec<Op>) {
    let mut world = World::new(defences);
    let mut p = Pipeline::new([]);
    for op in ops {
        world.step(&mut p, op);
    }
    world.settle_all(&mut p);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn the_pipeline_loses_and_reorders_nothing(ops in prop::collection::vec(op(), 0..120)) {
        run(ALL, ops);
    }
}

/// The model finds what each defence is for: with any one of them taken away, some interleaving
/// loses or strands an event, or lets one overtake an older one of its aggregate.
#[test]
fn without_any_one_defence_the_model_finds_a_defect() {
    use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
    for (name, defences) in [
        (
            "aggregates found held at start recorded",
            Defences {
                record_at_start: false,
                ..ALL
            },
        ),
        (
            "the claim's checks (older pending row, moved row)",
            Defences {
                claim_checks: false,
                ..ALL
            },
        ),
        (
            "the stream's fallback",
            Defences {
                fallback: false,
                ..ALL
            },
        ),
    ] {
        // A fixed seed: the same interleavings every run (a search that may miss is no test).
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: 3000,
                failure_persistence: None,
                ..Config::default()
            },
            TestRng::deterministic_rng(RngAlgorithm::ChaCha),
        );
        let found = runner.run(&prop::collection::vec(op(), 0..120), |ops| {
            run(defences, ops);
            Ok(())
        });
        match found {
            Err(TestError::Fail(why, ops)) => {
                eprintln!("without {name}: {why}; {} steps: {ops:?}", ops.len())
            }
            other => panic!("without {name} the model found nothing: {other:?}"),
        }
    }
}

/// The two defects found by careful operators, as unit tests of the pipeline.
#[test]
fn a_row_not_visible_is_carried_while_its_aggregate_goes_to_the_table_and_back() {
    let mut p = Pipeline::new([key(0)]);
    let row = Candidate {
        transaction: None,
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
        0,
    );
    assert!(p.publish(cut.batch).is_empty());
    assert!(p.settled(cut.batch, &HashSet::new()).is_empty());
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), None, "the slot waits for the row");
    // The table has no pending row of the aggregate: it goes back to the stream, frozen (the
    // stream holds a row of it).
    let round = p.serve(vec![key(0)]);
    assert!(round.frozen.contains(&key(0)));
    p.taken_back(&round.aggregates);
    // Visible now: it goes out from the stream.
    let cut = p.cut(10, 10).expect("claimed again");
    p.claimed(
        cut.batch,
        &HashMap::from([(row.id, Found::Claimed)]),
        &HashMap::new(),
        &HashMap::new(),
        0,
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
            transaction: None,
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
        0,
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
        0,
    );
    assert!(p.publish(cut.batch).is_empty());
    p.settled(cut.batch, &HashSet::new());
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), Some(20));
}

/// A row behind an older row of its aggregate that the stream has not brought (committed after
/// it) is parked: out of the read-ahead (the stream keeps moving, however long it goes without a
/// commit, as through one transaction larger than the read-ahead) and not claimed again until the
/// stream proves something. The stream bringing the older row: the row goes out first (commit
/// order). The stream passing the position where the older row would be: the table takes the
/// aggregate (the older row is in no stream). Before, rows waiting like this that filled the
/// read-ahead while no commit came sent their aggregate to the table, reversing commit order.
#[test]
fn a_row_behind_an_older_row_the_stream_has_not_brought_waits_for_the_stream() {
    let (high, older) = (row(0), row(0));
    let mut p = Pipeline::new([]);
    p.stream(Change::Begin);
    p.stream(Change::Insert(high.clone()));
    p.stream(Change::Commit { end: 10 });
    let prev = HashMap::from([(high.id, older.id)]);
    let cut = p.cut(1, 10).expect("a batch");
    let claimed = HashMap::from([(high.id, Found::Claimed)]);
    p.claimed(cut.batch, &claimed, &HashMap::new(), &prev, 100);
    assert!(p.publish(cut.batch).is_empty(), "the older row may come");
    assert!(p.settled(cut.batch, &HashSet::new()).is_empty());
    p.recorded(cut.batch);
    assert_eq!((p.parked(), p.queued().0), (1, 0), "parked, not read-ahead");
    // One transaction far larger than the read-ahead (a batch of one): its rows go out while the
    // parked row waits, whatever their number and though no commit comes.
    p.stream(Change::Begin);
    for _ in 0..50 {
        p.stream(Change::Insert(row(1)));
        let cut = p.cut(1, 10).expect("the big transaction's row");
        assert_ne!(cut.rows[0].id, high.id, "parked rows are not claimed again");
        let found = HashMap::from([(cut.rows[0].id, Found::Claimed)]);
        p.claimed(cut.batch, &found, &HashMap::new(), &HashMap::new(), 100);
        assert_eq!(p.publish(cut.batch).len(), 1);
        let ids: HashSet<Uuid> = cut.rows.iter().map(|r| r.id).collect();
        assert!(
            p.settled(cut.batch, &ids).is_empty(),
            "nothing to the table"
        );
        p.recorded(cut.batch);
    }
    p.stream(Change::Commit { end: 50 });
    assert_eq!(p.parked(), 1, "the stream has not passed 100");
    // The older row comes: the parked row is claimed again, and goes out first.
    p.stream(Change::Begin);
    p.stream(Change::Insert(older.clone()));
    assert_eq!(p.parked(), 0);
    let cut = p.cut(10, 10).expect("both");
    assert_eq!(cut.rows[0].id, high.id);
    let found = HashMap::from([(high.id, Found::Claimed), (older.id, Found::Claimed)]);
    p.claimed(cut.batch, &found, &HashMap::new(), &prev, 100);
    assert_eq!(
        p.publish(cut.batch),
        [vec![high.id, older.id]],
        "commit order"
    );

    // Another row waiting so: the stream passes its position, and its aggregate goes to the table.
    let lone = row(2);
    let mut p = Pipeline::new([]);
    p.stream(Change::Begin);
    p.stream(Change::Insert(lone.clone()));
    p.stream(Change::Commit { end: 10 });
    let prev = HashMap::from([(lone.id, Uuid::new_v4())]);
    let claimed = HashMap::from([(lone.id, Found::Claimed)]);
    let cut = p.cut(10, 10).expect("a batch");
    p.claimed(cut.batch, &claimed, &HashMap::new(), &prev, 20);
    assert!(p.publish(cut.batch).is_empty());
    assert!(p.settled(cut.batch, &HashSet::new()).is_empty());
    p.recorded(cut.batch);
    assert!(p.cut(10, 10).is_none(), "parked");
    p.stream(Change::Idle { wal_end: 20 });
    let cut = p
        .cut(10, 10)
        .expect("claimed again once the stream passed 20");
    p.claimed(cut.batch, &claimed, &HashMap::new(), &prev, 30);
    assert!(p.publish(cut.batch).is_empty());
    assert_eq!(
        p.settled(cut.batch, &HashSet::new()),
        [key(2)],
        "the older row is in no stream: the table takes the aggregate"
    );
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), Some(20));
}

/// What a round serves comes from the durable record: an aggregate this pipeline never handed over
/// (recorded by another relay, a script, or with rows the sweep found moved) is learnt, and the
/// next round starts after the last one served, among thousands held.
#[test]
fn a_round_serves_what_the_record_says_and_memory_learns_it() {
    let held: Vec<AggregateKey> = (0..5_000)
        .map(|i| ("order".into(), format!("h{i:05}")))
        .collect();
    let mut p = Pipeline::new(held.iter().cloned());
    assert_eq!(
        p.cursor(),
        AggregateKey::default(),
        "the first round starts at the start"
    );
    let stranger: AggregateKey = ("order".into(), "m7".into());
    assert!(!p.held().contains(&stranger));
    let round = p.serve(vec![held[4_321].clone(), stranger.clone()]);
    assert!(round.frozen.is_empty());
    assert!(p.held().contains(&stranger), "memory learns the record");
    assert_eq!(
        p.cursor(),
        stranger,
        "the next round starts after the last served"
    );
    // A round that serves nothing keeps the cursor.
    let round = p.serve(Vec::new());
    assert_eq!(round, Round::default());
    assert_eq!(p.cursor(), stranger);
    p.taken_back(std::slice::from_ref(&stranger));
    assert!(!p.held().contains(&stranger));
}

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
    // T held: A is not published, its aggregate goes to the table.
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
