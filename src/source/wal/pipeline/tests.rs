//! The pipeline against a model of the world around it (the outbox table, the broker, the
//! stream, the slot, operators and the process itself), driven through random interleavings of
//! everything that can happen:
//! - writers: transactions committing (visible at once or only later: a commit streams before it
//!   is visible; or in no stream: a publication that left the table out for a moment), a writer
//!   that inserted first committing last (seq order is not commit order), one transaction far
//!   larger than the read-ahead;
//! - the stream sending whole transactions, or a few inserts at a time with the commit long after
//!   (a stream that moves for a long time without a commit), and keepalives;
//! - claims, publishes with failures and broker outages, records that fail, rows held by other
//!   sessions, rows moved to another aggregate or deleted by hand after their commit, retries
//!   falling due, attempts running out (dead letters), operators retrying and discarding dead
//!   letters, aggregates blocked behind dead heads;
//! - sweeps of the aggregates the table holds (chosen from the durable record, those behind a dead
//!   head skipped), with the world changing between a round's read and its claim (rows moved,
//!   deleted, locked by hand while they are swept); the stream's fallback; and crashes: the relay
//!   restarting (or another one taking over) with only what is durable (the rows,
//!   `outbox_wal_deferred`, the slot's confirmed position, what the broker stored), its pipeline
//!   rebuilt from the database and the stream sent again from the confirmed position.
//!
//! After every step: nothing the slot confirmed past is known only in memory (each such streamed
//! row is published, or pending and visible with its aggregate recorded as held by the table);
//! the pipeline's held aggregates are the recorded ones; no discarded row is published; and per
//! aggregate the first publications follow commit order, except where the table publishes (seq
//! order, seeing only visible rows) an aggregate that had a failure, a lock, a row in no stream
//! or a row moved: the table may take only those. At the end, with every trouble gone, every row
//! is published but the discarded ones (the retried dead letters too, the ones no stream carried
//! too), no aggregate is left with the table and the slot confirms the last commit. Beside it:
//! a retried or discarded dead letter is served by the very next sweep round among thousands of
//! aggregates blocked, and the scenarios operators reproduced, replayed as steps of the model.
//! On d1b5758, before issue 45's fixes, the model finds its items 1 (the busy stream's scenario:
//! commit order reversed), 2 (the next-round test: a retried dead letter waits up to a round per
//! 100 aggregates blocked) and 6 (the moved-while-swept scenario, and the random interleavings
//! within a few runs: an aggregate recorded as held that memory never learns, never swept).

use std::collections::{BTreeSet, HashMap, HashSet};

use proptest::prelude::*;
use uuid::Uuid;

use super::*;
use crate::source::wal::control::Scan;
use crate::source::wal::fallback::suspects;

fn key(a: u32) -> AggregateKey {
    ("order".into(), format!("a{a:05}"))
}

/// The model's aggregate of a key (see `key`).
fn agg(k: &AggregateKey) -> u32 {
    k.1.get(1..)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX)
}

/// A new streamed row of aggregate `agg`.
fn row(agg: u32) -> Candidate {
    Candidate {
        transaction: None,
        id: Uuid::new_v4(),
        aggregate: key(agg),
        xid: 1,
        size: 1,
        content: None,
    }
}

/// Failed publishes a row has before it is a dead letter.
const ATTEMPTS: u8 = 2;

/// Rows a sweep round takes per aggregate (the relay's share of a quarter batch).
const SHARE: usize = 4;

/// One outbox row of the model. Its index is its seq (the order rows were inserted in); its
/// commit order is its transaction's end position, then its place in the transaction: a writer
/// that inserted first and committed last has the lower seq and the later commit.
#[derive(Debug, Clone)]
struct Row {
    id: Uuid,
    /// Its aggregate now.
    aggregate: u32,
    /// Its aggregate as inserted: what the stream carries.
    inserted_as: u32,
    /// The end position of its transaction's commit (`u64::MAX` while it is open).
    end: u64,
    committed: bool,
    visible: bool,
    streamed: bool,
    /// In no stream (committed while the publication left the table out).
    skipped: bool,
    /// Published and recorded (or discarded): not pending any more.
    processed: bool,
    /// Discarded by an operator: processed, never published.
    discarded: bool,
    /// Deleted by hand (nothing to publish).
    deleted: bool,
    /// Locked by another session.
    locked: bool,
    /// Its publish fails (until fixed); a failure records a retry (not eligible until `retried`).
    poison: bool,
    eligible: bool,
    /// Failures recorded.
    attempts: u8,
    /// A dead letter: its attempts ran out; only an operator's retry or discard moves it on.
    dead: bool,
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
        aggregates: [u32; 3],
        len: u8,
        visible: bool,
        poison: bool,
        skipped: bool,
    },
    /// One transaction larger than the read-ahead (a batch job): `len` rows of two aggregates.
    Big {
        aggregates: [u32; 2],
        len: u8,
        visible: bool,
    },
    /// A writer inserts a row (its seq is taken now) and keeps its transaction open.
    Open(u32),
    /// A writer with an open transaction commits (visible at once or not).
    CommitOpen(u8, bool),
    /// The stream sends the rest of the transaction it is in (or the next one) and its commit.
    Stream,
    /// The stream sends the next few inserts of a transaction; its commit only after the last.
    StreamSome(u8),
    /// A keepalive.
    Idle,
    /// A committed transaction not visible becomes visible.
    Reveal(u8),
    /// Another session locks or unlocks a row.
    ToggleLock(u8),
    /// A failed row becomes eligible again (its retry is due; not a dead letter's).
    Retry(u8),
    /// An operator's `dead-letters retry` of a dead letter (`true`: its cause fixed first).
    RetryDead(u8, bool),
    /// An operator's `dead-letters discard` of a dead letter.
    Discard(u8),
    /// Aggregates each behind a head whose next failure makes it a dead letter, a row behind it.
    Blocked(u8),
    /// A row is moved to another aggregate by hand.
    Move(u8, u32),
    /// A row is deleted by hand.
    Delete(u8),
    Cut,
    Claim,
    /// Publish the next batch (`true`: the broker is down for it).
    Publish(bool),
    /// Record the oldest batch (`true`: the record fails).
    Record(bool),
    /// A sweep round reads what it serves; its claim comes with the next step of the relay (or
    /// the next `Sweep`): the world's steps in between happen while the round runs.
    Sweep,
    /// A look of the stream's fallback.
    Fallback,
    /// The relay dies and starts again (or another one takes over): only what is durable stays.
    Restart,
}

impl Op {
    /// A step of the world outside the relay (it may come while a sweep round runs).
    fn of_the_world(self) -> bool {
        !matches!(
            self,
            Op::Stream
                | Op::StreamSome(_)
                | Op::Idle
                | Op::Cut
                | Op::Claim
                | Op::Publish(_)
                | Op::Record(_)
                | Op::Sweep
                | Op::Fallback
        )
    }
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
                aggregates: [a[0] % 4, a[1] % 4, a[2] % 4].map(u32::from),
                len,
                visible: visible || skipped,
                poison,
                skipped,
            }),
        1 => (any::<[u8; 2]>(), 5u8..=10, any::<bool>()).prop_map(|(a, len, visible)| Op::Big {
            aggregates: [a[0] % 4, a[1] % 4].map(u32::from),
            len,
            visible,
        }),
        1 => any::<u8>().prop_map(|a| Op::Open(u32::from(a % 4))),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(n, v)| Op::CommitOpen(n, v)),
        3 => Just(Op::Stream),
        2 => (1u8..=3).prop_map(Op::StreamSome),
        1 => Just(Op::Idle),
        3 => any::<u8>().prop_map(Op::Reveal),
        1 => any::<u8>().prop_map(Op::ToggleLock),
        1 => any::<u8>().prop_map(Op::Retry),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(n, fixed)| Op::RetryDead(n, fixed)),
        1 => any::<u8>().prop_map(Op::Discard),
        1 => (1u8..=3).prop_map(Op::Blocked),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(n, to)| Op::Move(n, u32::from(to % 4))),
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

/// A sweep round read and not claimed yet (`store.rs`'s sweep up to its claim).
#[derive(Debug)]
struct Swept {
    /// Per aggregate that may go, the rows read (its eligible prefix, seq order).
    rows: Vec<(AggregateKey, Vec<usize>)>,
    /// Aggregates whose every pending row was read.
    complete: Vec<AggregateKey>,
    /// Aggregates with no pending row.
    cleared: Vec<AggregateKey>,
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
    /// Of that transaction, the inserts sent already (its commit not yet).
    sent: usize,
    /// The rows of writers whose transaction is open.
    open: Vec<usize>,
    wal: u64,
    /// `outbox_wal_deferred`.
    deferred: BTreeSet<AggregateKey>,
    /// First publication of each row, in order, with its aggregate then.
    log: Vec<(usize, u32)>,
    first: HashSet<usize>,
    /// Pairs (earlier, later) the table published out of commit order: the earlier one was
    /// committed but not visible yet (the table sees only visible rows), or has the higher seq
    /// in an aggregate the table may take (`troubled`).
    excused: HashSet<(usize, usize)>,
    /// Aggregates that had a failure, a row locked by another session, a row in no stream or a
    /// row moved: the only ones that may go to the table, where seq order replaces commit order.
    troubled: HashSet<u32>,
    /// Dead letters an operator retried.
    retried: HashSet<usize>,
    /// The slot's confirmed position (durable).
    confirmed: u64,
    batches: VecDeque<Batch>,
    /// The fallback's last look.
    scan: Option<Scan>,
    /// A sweep round read, its claim to come.
    sweeping: Option<Swept>,
    /// Aggregates a sweep round serves (the relay: 100).
    round: usize,
    /// The next aggregate `Op::Blocked` creates.
    next_aggregate: u32,
}

impl World {
    fn new(defences: Defences) -> World {
        World {
            defences,
            rows: Vec::new(),
            by_id: HashMap::new(),
            txs: Vec::new(),
            next_tx: 0,
            sent: 0,
            open: Vec::new(),
            wal: 0,
            deferred: BTreeSet::new(),
            log: Vec::new(),
            first: HashSet::new(),
            excused: HashSet::new(),
            troubled: HashSet::new(),
            retried: HashSet::new(),
            confirmed: 0,
            batches: VecDeque::new(),
            scan: None,
            sweeping: None,
            round: 2,
            next_aggregate: 100,
        }
    }

    /// Commit order.
    fn order(&self, i: usize) -> (u64, usize) {
        (self.rows[i].end, i)
    }

    fn publish(&mut self, i: usize) {
        assert!(!self.rows[i].discarded, "row {i} published, discarded");
        if self.first.insert(i) {
            self.log.push((i, self.rows[i].aggregate));
        }
    }

    fn claimable(&self, i: usize) -> bool {
        let r = &self.rows[i];
        r.pending() && !r.locked && r.eligible
    }

    /// A writer inserts a row (in an open transaction).
    fn insert(&mut self, aggregate: u32, poison: bool) -> usize {
        let id = Uuid::new_v4();
        let i = self.rows.len();
        self.by_id.insert(id, i);
        self.rows.push(Row {
            id,
            aggregate,
            inserted_as: aggregate,
            end: u64::MAX,
            committed: false,
            visible: false,
            streamed: false,
            skipped: false,
            processed: false,
            discarded: false,
            deleted: false,
            locked: false,
            poison,
            eligible: true,
            attempts: 0,
            dead: false,
            moved_at: None,
        });
        i
    }

    /// The transaction of `rows` commits.
    fn commit(&mut self, rows: Vec<usize>, visible: bool, skipped: bool) {
        self.wal += 10;
        for &i in &rows {
            let r = &mut self.rows[i];
            r.end = self.wal;
            r.committed = true;
            r.visible = visible || skipped;
            r.skipped = skipped;
            if skipped {
                self.troubled.insert(r.aggregate);
            }
        }
        self.txs.push(rows);
    }

    /// A failed publish recorded.
    fn failure(&mut self, i: usize) {
        let r = &mut self.rows[i];
        r.eligible = false;
        r.attempts = r.attempts.saturating_add(1);
        r.dead = r.attempts >= ATTEMPTS;
        self.troubled.insert(r.aggregate);
    }

    /// The dead letters, in seq order.
    fn dead(&self) -> Vec<usize> {
        (0..self.rows.len())
            .filter(|&i| self.rows[i].dead && self.rows[i].pending())
            .collect()
    }

    /// `dead-letters retry` (dead_letters_retry.sql): a fresh set of attempts.
    fn retry_dead(&mut self, i: usize, fixed: bool) {
        let r = &mut self.rows[i];
        r.dead = false;
        r.attempts = 0;
        r.eligible = true;
        if fixed {
            r.poison = false;
        }
        self.retried.insert(i);
    }

    /// `dead-letters discard` (dead_letters_discard.sql): marked processed, never published; the
    /// aggregate's later rows may go.
    fn discard(&mut self, i: usize) {
        let r = &mut self.rows[i];
        r.processed = true;
        r.discarded = true;
    }

    /// What the claim of one candidate finds, as the claim statements see the table: moved rows
    /// and rows behind an older pending row of their aggregate (by seq) are reported with the
    /// claim.
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

    /// The stream sends up to `max` inserts of the transaction it is in (or of the next one),
    /// and its commit once the last is sent.
    fn stream(&mut self, p: &mut Pipeline, max: usize) {
        if self.sent == 0 {
            // A transaction in no stream: the stream's position moves past it unseen.
            while self
                .txs
                .get(self.next_tx)
                .is_some_and(|tx| self.rows[tx[0]].skipped)
            {
                self.next_tx += 1;
            }
        }
        let Some(tx) = self.txs.get(self.next_tx).cloned() else {
            return;
        };
        if self.sent == 0 {
            p.stream(Change::Begin);
        }
        for &i in tx.iter().skip(self.sent).take(max) {
            let r = &mut self.rows[i];
            r.streamed = true;
            self.sent += 1;
            p.stream(Change::Insert(Candidate {
                transaction: None,
                id: r.id,
                aggregate: key(r.inserted_as),
                xid: 1,
                size: 1,
                content: None,
            }));
        }
        if self.sent == tx.len() {
            self.next_tx += 1;
            self.sent = 0;
            let end = self.rows[tx[0]].end;
            p.stream(Change::Commit { end });
        }
    }

    fn step(&mut self, p: &mut Pipeline, op: Op) {
        // The relay's next step comes once the sweep round running is claimed and recorded.
        if !op.of_the_world() {
            if let Some(swept) = self.sweeping.take() {
                self.sweep_claim(p, swept);
                if matches!(op, Op::Sweep) {
                    self.after_step(p);
                    return;
                }
            }
        }
        match op {
            Op::Commit {
                aggregates,
                len,
                visible,
                poison,
                skipped,
            } => {
                let tx: Vec<usize> = (aggregates.iter().take(usize::from(len)).enumerate())
                    .map(|(n, &a)| self.insert(a, poison && n == 0))
                    .collect();
                self.commit(tx, visible, skipped);
            }
            Op::Big {
                aggregates,
                len,
                visible,
            } => {
                let tx: Vec<usize> = (0..usize::from(len))
                    .map(|n| self.insert(aggregates[n % 2], false))
                    .collect();
                self.commit(tx, visible, false);
            }
            Op::Open(a) => {
                let i = self.insert(a, false);
                self.open.push(i);
            }
            Op::CommitOpen(n, visible) => {
                if !self.open.is_empty() {
                    let i = self.open.remove(usize::from(n) % self.open.len());
                    self.commit(vec![i], visible, false);
                }
            }
            Op::Stream => self.stream(p, usize::MAX),
            Op::StreamSome(n) => self.stream(p, usize::from(n)),
            Op::Idle => {
                // The server has sent everything committed so far (or nothing is left to send).
                let sent = self.sent == 0
                    && self.txs[self.next_tx..]
                        .iter()
                        .all(|tx| self.rows[tx[0]].skipped);
                if sent {
                    self.next_tx = self.txs.len();
                    p.stream(Change::Idle { wal_end: self.wal });
                }
            }
            Op::Reveal(n) => {
                let hidden: Vec<usize> = (0..self.rows.len())
                    .filter(|&i| self.rows[i].committed && !self.rows[i].visible)
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
                    if self.rows[i].committed && !self.in_claimed_batch(i) {
                        self.rows[i].locked = !self.rows[i].locked;
                        self.troubled.insert(self.rows[i].aggregate);
                    }
                }
            }
            Op::Retry(n) => {
                if !self.rows.is_empty() {
                    let i = usize::from(n) % self.rows.len();
                    let r = &mut self.rows[i];
                    r.eligible |= !r.dead;
                }
            }
            Op::RetryDead(n, fixed) => {
                let dead = self.dead();
                if !dead.is_empty() {
                    self.retry_dead(dead[usize::from(n) % dead.len()], fixed);
                }
            }
            Op::Discard(n) => {
                let dead = self.dead();
                if !dead.is_empty() {
                    self.discard(dead[usize::from(n) % dead.len()]);
                }
            }
            Op::Blocked(n) => {
                for _ in 0..n {
                    let a = self.next_aggregate;
                    self.next_aggregate += 1;
                    let head = self.insert(a, true);
                    self.rows[head].attempts = ATTEMPTS - 1;
                    let tail = self.insert(a, false);
                    self.commit(vec![head, tail], true, false);
                }
            }
            Op::Move(n, to) => {
                // A pending row; an UPDATE waits for a batch's lock: only rows no batch in flight
                // holds.
                let pending: Vec<usize> = (0..self.rows.len())
                    .filter(|&i| self.rows[i].pending())
                    .collect();
                if !pending.is_empty() {
                    let i = pending[usize::from(n) % pending.len()];
                    let r = &self.rows[i];
                    if r.aggregate != to && !self.in_claimed_batch(i) {
                        let at = self.log.len();
                        let r = &mut self.rows[i];
                        self.troubled.insert(r.aggregate);
                        self.troubled.insert(to);
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
                    return self.after_step(p);
                };
                if !self.batches[at].claimed {
                    return self.after_step(p);
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
                    return self.after_step(p);
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
                    return self.after_step(p);
                };
                let Some((acked, failed, handed)) = &b.published else {
                    return self.after_step(p);
                };
                let id = b.id;
                if fails {
                    p.failed(id);
                    self.batches.clear();
                    return self.after_step(p);
                }
                let (acked, failed, handed) = (acked.clone(), failed.clone(), handed.clone());
                for a in acked {
                    let i = self.by_id[&a];
                    self.rows[i].processed = true;
                }
                for f in failed {
                    self.failure(self.by_id[&f]);
                }
                self.deferred.extend(handed);
                p.recorded(id);
                self.batches.pop_front();
            }
            Op::Sweep => self.sweep_read(p),
            Op::Fallback => self.fallback(p),
            Op::Restart => {
                // Batches in flight and a sweep round running roll back; the stream goes again
                // from the slot's position; the new pipeline knows what the database says is held.
                self.batches.clear();
                self.sweeping = None;
                self.sent = 0;
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
        self.after_step(p);
    }

    fn after_step(&mut self, p: &mut Pipeline) {
        if let Some(position) = p.confirm() {
            self.confirmed = self.confirmed.max(position);
        }
        self.check(p);
    }

    /// The aggregates a sweep round serves (`sweep.rs`, `sweep_round.sql`): the durable record
    /// decides, up to `round` of them after the cursor, going round, skipping those whose oldest
    /// pending row is a dead letter (nothing to do until an operator retries or discards it).
    fn serve(&self, p: &mut Pipeline) -> Round {
        let cursor = p.cursor();
        let mut head_dead: HashMap<u32, bool> = HashMap::new();
        for r in self.rows.iter().filter(|r| r.pending()) {
            head_dead.entry(r.aggregate).or_insert(r.dead);
        }
        let servable: Vec<&AggregateKey> = self
            .deferred
            .iter()
            .filter(|k| !head_dead.get(&agg(k)).copied().unwrap_or(false))
            .collect();
        let chosen: Vec<AggregateKey> = servable
            .iter()
            .filter(|k| ***k > cursor)
            .chain(servable.iter().filter(|k| ***k <= cursor))
            .take(self.round)
            .map(|k| (*k).clone())
            .collect();
        p.serve(chosen)
    }

    /// What a sweep's record tells the pipeline (`sweep.rs`): the aggregates it handed to the
    /// table (rows found moved under it) and those it took back.
    fn sweep_recorded(p: &mut Pipeline, defer: Vec<AggregateKey>, undefer: &[AggregateKey]) {
        p.hand_over(defer);
        p.taken_back(undefer);
    }

    /// A sweep round up to its claim (`store.rs`): what it serves, then of each aggregate not
    /// frozen whose oldest pending row may go, the eligible rows in seq order (up to a share).
    fn sweep_read(&mut self, p: &mut Pipeline) {
        if !self.batches.is_empty() {
            return;
        }
        let round = self.serve(p);
        let at: HashMap<u32, usize> = (round.aggregates.iter().enumerate())
            .map(|(n, k)| (agg(k), n))
            .collect();
        let mut pending: Vec<Vec<usize>> = vec![Vec::new(); round.aggregates.len()];
        for (i, r) in self.rows.iter().enumerate() {
            if let Some(&n) = at.get(&r.aggregate).filter(|_| r.pending()) {
                pending[n].push(i);
            }
        }
        let mut swept = Swept {
            rows: Vec::new(),
            complete: Vec::new(),
            cleared: Vec::new(),
        };
        for (k, rows) in round.aggregates.iter().zip(pending) {
            assert!(self.deferred.contains(k), "swept {k:?}, not with the table");
            if rows.is_empty() {
                swept.cleared.push(k.clone());
                continue;
            }
            if round.frozen.contains(k) {
                continue;
            }
            let taken: Vec<usize> = (rows.iter().copied().take(SHARE))
                .take_while(|&i| self.rows[i].eligible)
                .collect();
            if taken.len() == rows.len() {
                swept.complete.push(k.clone());
            }
            if !taken.is_empty() {
                swept.rows.push((k.clone(), taken));
            }
        }
        self.sweeping = Some(swept);
    }

    /// A sweep round's claim (by id, as the table is now), publish and record: rows moved from
    /// the aggregate since the read hand their new aggregate to the table too; rows held
    /// elsewhere or not eligible stop their aggregate; the round takes back the aggregates it
    /// found with nothing pending, or whose every pending row it published.
    fn sweep_claim(&mut self, p: &mut Pipeline, swept: Swept) {
        let mut defer: Vec<AggregateKey> = Vec::new();
        let mut groups: Vec<(AggregateKey, Vec<usize>)> = Vec::new();
        for (k, rows) in &swept.rows {
            let mut group = Vec::new();
            for &i in rows {
                let r = &self.rows[i];
                if r.processed || r.deleted {
                    continue;
                }
                if key(r.aggregate) != *k {
                    defer.extend([k.clone(), key(r.aggregate)]);
                    break;
                }
                if !self.claimable(i) {
                    defer.push(k.clone());
                    break;
                }
                group.push(i);
            }
            if !group.is_empty() {
                groups.push((k.clone(), group));
            }
        }
        let mut out = Vec::new();
        for (k, group) in groups {
            let mut all = true;
            for i in group {
                if self.rows[i].poison {
                    self.failure(i);
                    all = false;
                    break;
                }
                self.excuse(i);
                self.publish(i);
                self.rows[i].processed = true;
            }
            if all {
                out.push(k);
            }
        }
        let mut undefer = swept.cleared;
        undefer
            .extend((swept.complete.into_iter()).filter(|k| out.contains(k) && !defer.contains(k)));
        self.deferred.extend(defer.iter().cloned());
        for k in &undefer {
            self.deferred.remove(k);
        }
        World::sweep_recorded(p, defer, &undefer);
    }

    /// The table publishes row `x` in seq order: the rows of its aggregate that committed before
    /// it and are not out yet may follow it when they were not visible (the table cannot see
    /// them) or have a higher seq in an aggregate the table may take.
    fn excuse(&mut self, x: usize) {
        let a = self.rows[x].aggregate;
        let troubled = self.troubled.contains(&a);
        for y in 0..self.rows.len() {
            let r = &self.rows[y];
            let later = r.aggregate == a && r.committed && !self.first.contains(&y);
            if y != x && later && self.order(y) < self.order(x) && (!r.visible || troubled) {
                self.excused.insert((y, x));
            }
        }
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
        let mut seen = HashSet::new();
        for r in self.rows.iter().filter(|r| r.pending()) {
            if seen.insert(r.aggregate) && r.eligible {
                let k = key(r.aggregate);
                if !self.deferred.contains(&k) {
                    rows.push((r.id, k));
                }
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
        let held: HashSet<u32> = self.deferred.iter().map(agg).collect();
        for (i, r) in self.rows.iter().enumerate() {
            if r.end <= self.confirmed && r.streamed && r.moved_at.is_none() && !r.deleted {
                let with_table = r.visible && held.contains(&r.aggregate);
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
            "the aggregates held by the table in memory and in the record differ"
        );
        // First publications per aggregate in commit order, among the rows written as they are.
        // A row moved to another aggregate by hand joins that aggregate's order when the claim
        // sees the move (it goes to the table, both aggregates with it), but not against rows
        // claimed before the move committed, nor behind rows already out: those pairs are not
        // checked (the model checks that it is published, and that nothing is lost). A row in no
        // stream is found by seq (the claim's probe of the nearest older pending row, the
        // fallback): checked in seq order, and not at all in an aggregate whose writers commit
        // out of seq order (the nearest older row may be one the stream brought, committed
        // after the row in no stream: a row behind it in seq but before it in commit order then
        // goes out first, as the one probe cannot see the row in no stream behind that one).
        let mut last: HashMap<u32, usize> = HashMap::new();
        for &(i, a) in &self.log {
            if let Some(prev) = last.insert(a, i) {
                let moved = self.rows[i].moved_at.is_some() || self.rows[prev].moved_at.is_some();
                // A row in no stream is found by its seq (the claim's older row, the fallback).
                let skipped = self.rows[i].skipped || self.rows[prev].skipped;
                assert!(
                    self.order(prev) < self.order(i)
                        || self.excused.contains(&(i, prev))
                        || moved
                        || (skipped && (prev < i || self.reordered(a))),
                    "aggregate {a}: row {i} (commit {:?}) published after row {prev} (commit \
                     {:?}); log {:?}",
                    self.order(i),
                    self.order(prev),
                    self.log
                );
            }
        }
    }

    /// Writers of aggregate `a` committed out of seq order.
    fn reordered(&self, a: u32) -> bool {
        let mut rows = (0..self.rows.len()).filter(|&i| self.rows[i].inserted_as == a);
        let Some(first) = rows.next() else {
            return false;
        };
        let mut latest = self.order(first);
        rows.any(|i| {
            let order = self.order(i);
            let earlier = order < latest;
            latest = latest.max(order);
            earlier
        })
    }

    /// Every trouble gone (open transactions committed, dead letters retried with their cause
    /// fixed): drives the pipeline until nothing is left.
    fn settle_all(&mut self, p: &mut Pipeline) {
        for i in std::mem::take(&mut self.open) {
            self.commit(vec![i], true, false);
        }
        for i in self.dead() {
            self.retry_dead(i, true);
        }
        for r in &mut self.rows {
            r.visible = true;
            r.locked = false;
            r.poison = false;
            r.eligible = true;
        }
        for _ in 0..500 {
            let done = self.next_tx == self.txs.len()
                && self.batches.is_empty()
                && self.sweeping.is_none()
                && p.in_flight() == 0
                && p.held().is_empty()
                && self.confirmed == self.wal
                && self.rows.iter().all(|r| r.processed || r.deleted);
            if done {
                break;
            }
            // Failures recorded by batches published before: their retries come due, or the
            // operator retries them.
            for i in self.dead() {
                self.retry_dead(i, true);
            }
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
            if r.discarded {
                assert!(!self.first.contains(&i), "discarded row {i} published");
            } else {
                let out = r.processed && self.first.contains(&i);
                assert!(out || r.deleted, "row {i} never published: {r:?}");
            }
        }
        for &i in &self.retried {
            let r = &self.rows[i];
            assert!(
                self.first.contains(&i) || r.discarded || r.deleted,
                "retried dead letter {i} never published"
            );
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

/// The model's runs: XorShift draws the steps (ChaCha, the default, takes most of a debug build's
/// time).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_algorithm: proptest::test_runner::RngAlgorithm::XorShift,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn the_pipeline_loses_and_reorders_nothing(ops in prop::collection::vec(op(), 0..120)) {
        run(ALL, ops);
    }
}

const SEED: [u8; 16] = *b"\x01odel-of-the-wal";

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
                failure_persistence: None,
                ..config(3000)
            },
            TestRng::from_seed(RngAlgorithm::XorShift, &SEED),
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
/// is recorded as held and served (memory learns it), without a restart.
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
/// held, the slot past them.
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
                prop_assert!(!w.deferred.contains(&key(a)), "{a} not taken back");
            } else if discarded.contains(&a) {
                prop_assert!(!head && tail, "the row behind the discarded {a} not out");
                prop_assert!(!w.deferred.contains(&key(a)), "{a} not taken back");
            } else {
                prop_assert!(!head && !tail, "{a} went out, blocked");
            }
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
