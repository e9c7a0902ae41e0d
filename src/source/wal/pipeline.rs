//! The wal source's pipeline as a pure state machine: what the stream has sent, which rows are in
//! which batch, which aggregates the table holds, and how far the slot may confirm. The async
//! driver (`driver`) performs what it decides (claim, publish, record, sweep, confirm) and feeds
//! the results back; nothing here does I/O.
//!
//! A streamed row leaves the pipeline only when it is *resolved*:
//! - published (acked, and its batch recorded), or gone already (published before, or deleted);
//! - or with the table: its aggregate is handed to the table in a recorded transaction and the row
//!   is known to be visible there (a claim locked it), so the table's sweep will find it.
//!
//! A row whose transaction is not visible yet (a commit streams a moment before it becomes
//! visible; behind a synchronous standby a whole round trip) is never dropped: it is *carried*
//! and claimed again, whatever happens to its aggregate meanwhile. The slot's position moves past
//! a commit only once every row before it is resolved.
//!
//! Per aggregate, rows go out in stream (commit) order: a row is published only when every
//! earlier row of its aggregate was published; a row behind one that is carried is carried too;
//! a row behind one that went to the table goes to the table.
//!
//! Order by proof: a row leaves the stream's order (to the table) only when something proves that
//! no earlier-committing row of its aggregate can still arrive: the claim found the older row
//! pending (held elsewhere, dead-lettered), the table holds the aggregate already, or the stream
//! passed the WAL position the claim read after seeing an older row it had not brought. While
//! the stream has not, the row is parked outside the read-ahead (its content dropped, claimed
//! again when the stream brings that row or passes the position), so waiting never stops the
//! stream that will end it, and a moving stream is never taken for a stuck one. The same holds for
//! the rows an atomic completion takes from the table (the rest of a transaction a claim holds
//! part of): they wait for what the stream brought before them (`CommitOrder`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use uuid::Uuid;

use crate::event::{AggregateKey, OutboxEvent, TransactionPosition};
use crate::source::store::{CommitOrder, TakenOrder};

/// A streamed row to claim by id, with its aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub id: Uuid,
    pub aggregate: AggregateKey,
    /// The (32-bit) id of the transaction that wrote the row, from the stream; 0 for rows read
    /// from the table.
    pub xid: u32,
    /// The row's bytes as streamed (or measured in the table): what it weighs in a batch.
    pub size: usize,
    /// The row as its INSERT wrote it, when the stream carried all of it and nothing in its
    /// transaction changed it: published as it is if the claim finds the row unchanged since.
    pub content: Option<Streamed>,
    /// Where the row stands in its transaction, as the stream told (its `txid`, its place among
    /// the transaction's inserts, their count when the commit came within the stream's hold).
    /// `None` for rows read from the table, or without a `txid`.
    pub transaction: Option<TransactionPosition>,
}

/// A streamed row's content, shared (not copied) while the row moves through the pipeline.
#[derive(Debug, Clone)]
pub(crate) struct Streamed(pub Arc<OutboxEvent>);

/// The same content (the pipeline compares rows, never their bytes).
impl PartialEq for Streamed {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Streamed {}

/// One fact from the replication stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// A transaction begins.
    Begin,
    /// A committed insert into the outbox (its transaction's commit follows).
    Insert(Candidate),
    /// The transaction of the inserts before this one committed; `end`: the position after it.
    Commit { end: u64 },
    /// The server has sent everything up to `wal_end` (a keepalive).
    Idle { wal_end: u64 },
}

/// What a claim by id found of one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Claimed (locked): visible and publishable now.
    Claimed,
    /// Its transaction is not visible yet: claim it again shortly.
    NotVisible,
    /// Published already (a replay), or deleted.
    Done,
    /// Pending but not claimed: held by another session, waiting for a retry, dead-lettered.
    /// Its aggregate goes to the table.
    Pending,
}

/// A batch's number (increasing: batches are published and recorded in this order).
pub(crate) type BatchId = u64;

/// Rows to claim as one batch.
#[derive(Debug)]
pub(crate) struct Cut {
    pub batch: BatchId,
    pub rows: Vec<Candidate>,
}

/// A sweep of aggregates the table holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Round {
    pub aggregates: Vec<AggregateKey>,
    /// Of those, aggregates with a streamed row not resolved yet: none of their rows may be
    /// published by the sweep (that row may be older and not visible), but they may be taken back
    /// when the table holds no pending row of them.
    pub frozen: HashSet<AggregateKey>,
}

/// What becomes of a row in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Claimed: to publish (unless left out when its batch publishes).
    Publish,
    /// Acked.
    Published,
    /// Its aggregate is with the table, and the row is visible there.
    Table,
    Done,
    /// Back to the queue when the batch ends.
    Carry,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Claiming,
    Claimed,
    Published,
}

#[derive(Debug)]
struct Flight {
    id: BatchId,
    stage: Stage,
    /// The rows' indexes, in stream order.
    rows: Vec<u64>,
    /// Each row's fate (beside `rows`), once the claim decided it.
    fate: Vec<Fate>,
    /// Aggregates this batch hands to the table when it is recorded.
    handed: BTreeSet<AggregateKey>,
}

impl Flight {
    /// The fate of the row at stream `index` (rows are in stream order), once decided.
    fn fate_of(&self, index: u64) -> Option<Fate> {
        let at = self.rows.binary_search(&index).ok()?;
        self.fate.get(at).copied()
    }
}

#[derive(Debug)]
struct Tracked {
    row: Candidate,
    /// In a batch in flight.
    batch: Option<BatchId>,
    /// Came back from a batch not visible yet (claimed again after a short pause).
    carried: bool,
    /// Claimed behind an older row of its aggregate the stream had not brought: that row's id and
    /// the WAL position the stream must pass before it counts as in no stream (the position of
    /// the first claim that saw it: a later claim's would move the goal on and on).
    behind: Option<Park>,
    /// Set by the claim when the row waits for an older row of its aggregate the stream has not
    /// brought (or behind a row of its aggregate that does): that row's id and the position the
    /// stream must pass. The batch then parks the row instead of carrying it.
    park: Option<Park>,
}

/// What a parked row waits for: the id of the older row the stream has not brought, and the WAL
/// position the stream must pass for that row to be in no stream.
type Park = (Uuid, u64);

/// The pipeline's state (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct Pipeline {
    /// Unresolved streamed rows by their stream index.
    rows: BTreeMap<u64, Tracked>,
    next_index: u64,
    /// Commits streamed and not confirmed yet: (index of the first row after it, end position).
    commits: VecDeque<(u64, u64)>,
    in_tx: bool,
    /// A keepalive's position, confirmed once nothing is held.
    idle: Option<u64>,
    /// How far the stream has brought every commit: the last commit's end, or a keepalive's
    /// position outside a transaction.
    streamed_to: u64,
    confirmed: u64,
    /// Aggregates the table holds (recorded in `outbox_wal_deferred`).
    held: BTreeSet<AggregateKey>,
    /// Where the last sweep round stopped (the last aggregate it served).
    cursor: Option<AggregateKey>,
    /// Batches in flight, oldest first.
    flights: VecDeque<Flight>,
    next_batch: BatchId,
    /// Rows and bytes waiting for a batch.
    queued: (usize, usize),
    /// Rows parked until the stream proves something about them, by (position, index): claimed
    /// again once the stream passes the position (the older row they wait for is then in no
    /// stream) or brings that row (`awaited`). Parked rows are not in `queued`: they do not
    /// fill the read-ahead, so the stream that would resolve them keeps moving. Their content
    /// went with their first batch (a parked row weighs its id and aggregate).
    parked: BTreeSet<(u64, u64)>,
    /// The parked rows' indexes by the id of the row they wait for.
    awaited: HashMap<Uuid, Vec<u64>>,
    /// The indexes of the rows waiting for a batch (cut in this order without walking the rows
    /// in flight).
    waiting: BTreeSet<u64>,
    /// Rows waiting that were not carried (claimed at once, no pause).
    fresh: usize,
    /// The rows resolved by the last two records (published, gone or with the table), with the
    /// aggregate the stream carried: a claim running beside a record may still have seen them
    /// pending.
    recent: VecDeque<Vec<(Uuid, AggregateKey)>>,
}

impl Pipeline {
    /// Starts with the aggregates the table holds.
    pub fn new(held: impl IntoIterator<Item = AggregateKey>) -> Pipeline {
        Pipeline {
            held: held.into_iter().collect(),
            ..Pipeline::default()
        }
    }

    /// A change from the stream.
    pub fn stream(&mut self, change: Change) {
        match change {
            Change::Begin => self.in_tx = true,
            Change::Insert(row) => {
                if !self.awaited.is_empty() {
                    if let Some(indexes) = self.awaited.remove(&row.id) {
                        for index in indexes {
                            self.unpark(index);
                        }
                    }
                }
                self.queued.0 += 1;
                self.queued.1 = self.queued.1.saturating_add(row.size);
                self.waiting.insert(self.next_index);
                self.fresh += 1;
                self.rows.insert(
                    self.next_index,
                    Tracked {
                        row,
                        batch: None,
                        carried: false,
                        behind: None,
                        park: None,
                    },
                );
                self.next_index += 1;
            }
            Change::Commit { end } => {
                self.in_tx = false;
                self.commits.push_back((self.next_index, end));
                self.streamed_to = self.streamed_to.max(end);
                self.unpark_passed();
            }
            Change::Idle { wal_end } => {
                if !self.in_tx {
                    self.idle = Some(self.idle.map_or(wal_end, |i| i.max(wal_end)));
                    self.streamed_to = self.streamed_to.max(wal_end);
                    self.unpark_passed();
                }
            }
        }
    }

    /// Rows parked (not queued) waiting for the stream.
    #[cfg(test)]
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Claims again the parked rows whose position the stream has passed.
    fn unpark_passed(&mut self) {
        while let Some(&(since, index)) = self.parked.first() {
            if since > self.streamed_to {
                break;
            }
            if let Some((awaited, _)) = self.rows.get(&index).and_then(|t| t.park) {
                if let Some(list) = self.awaited.get_mut(&awaited) {
                    list.retain(|i| *i != index);
                    if list.is_empty() {
                        self.awaited.remove(&awaited);
                    }
                }
            }
            self.unpark(index);
        }
    }

    /// A parked row back in the queue (carried: claimed again after a short pause).
    fn unpark(&mut self, index: u64) {
        let Some(since) = self.rows.get_mut(&index).and_then(|t| t.park.take()) else {
            return;
        };
        self.parked.remove(&(since.1, index));
        self.requeue(index, true);
    }

    /// A row the claim found waiting for the stream leaves the queue until the stream proves
    /// something about it (see `parked`).
    fn park(&mut self, index: u64) {
        let Some((awaited, since)) = self.rows.get(&index).and_then(|t| t.park) else {
            self.requeue(index, true);
            return;
        };
        let brought = || self.rows.values().any(|t| t.row.id == awaited);
        if since <= self.streamed_to || brought() {
            // Passed already, or the stream brought the row since the claim: claim it again.
            if let Some(t) = self.rows.get_mut(&index) {
                t.park = None;
            }
            self.requeue(index, true);
            return;
        }
        if let Some(t) = self.rows.get_mut(&index) {
            t.batch = None;
            t.carried = true;
        }
        self.parked.insert((since, index));
        self.awaited.entry(awaited).or_default().push(index);
    }

    /// Rows and bytes streamed and not in a batch yet (the stream's buffer).
    pub fn queued(&self) -> (usize, usize) {
        self.queued
    }

    /// Rows wait for a batch, and some were not carried (claim now, no pause needed).
    pub fn has_fresh(&self) -> bool {
        debug_assert_eq!(
            self.fresh > 0,
            self.rows.values().any(|t| t.batch.is_none() && !t.carried),
            "the count of fresh rows drifted"
        );
        self.fresh > 0
    }

    /// Batches in flight.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.flights.len()
    }

    /// `batch` is in flight (not recorded, not failed).
    pub fn is_in_flight(&self, batch: BatchId) -> bool {
        self.flight_index(batch).is_some()
    }

    /// Aggregates the table holds.
    pub fn held(&self) -> &BTreeSet<AggregateKey> {
        &self.held
    }

    /// The position the slot was last told to confirm: every row committed before it is resolved.
    pub fn confirmed(&self) -> u64 {
        self.confirmed
    }

    /// The ids of the rows streamed and not resolved (waiting, carried or in a batch).
    pub fn tracked(&self) -> HashSet<Uuid> {
        self.rows.values().map(|t| t.row.id).collect()
    }

    /// Aggregates handed to the table outside a batch (recorded already: the stream's fallback
    /// found rows of them that no stream carried).
    pub fn hand_over(&mut self, keys: impl IntoIterator<Item = AggregateKey>) {
        self.held.extend(keys);
    }

    /// Takes the rows waiting for a batch, in stream order: at most `max_rows` and `max_bytes`
    /// (the first row always).
    pub fn cut(&mut self, max_rows: usize, max_bytes: usize) -> Option<Cut> {
        let id = self.next_batch;
        let mut taken = Vec::new();
        let mut bytes = 0usize;
        for &index in &self.waiting {
            let Some(t) = self.rows.get_mut(&index) else {
                continue;
            };
            let size = t.row.size;
            if !taken.is_empty()
                && (taken.len() >= max_rows || bytes.saturating_add(size) > max_bytes)
            {
                break;
            }
            bytes = bytes.saturating_add(size);
            t.batch = Some(id);
            if !t.carried {
                self.fresh -= 1;
            }
            t.carried = false;
            taken.push(index);
        }
        for index in &taken {
            self.waiting.remove(index);
        }
        if taken.is_empty() {
            return None;
        }
        self.next_batch += 1;
        self.queued.0 -= taken.len();
        self.queued.1 = self.queued.1.saturating_sub(bytes);
        // The content goes with the batch (the claim uses it once, without a copy); a row that
        // comes back from the batch is read from the table.
        let mut rows = Vec::with_capacity(taken.len());
        for i in &taken {
            if let Some(t) = self.rows.get_mut(i) {
                let content = t.row.content.take();
                rows.push(Candidate {
                    content,
                    ..t.row.clone()
                });
            }
        }
        self.flights.push_back(Flight {
            id,
            stage: Stage::Claiming,
            rows: taken,
            fate: Vec::new(),
            handed: BTreeSet::new(),
        });
        Some(Cut { batch: id, rows })
    }

    /// The claim of `batch` found `found` (a candidate missing there: not visible). Decides each
    /// row's fate inside the batch; the batches before it are settled when it publishes.
    /// `moved`: rows found pending in another aggregate than the stream carried (changed after
    /// their insert): that aggregate goes to the table too. `prev`: of the rows claimed, those
    /// with an older pending row of their aggregate, and its id: a row behind one this pipeline
    /// does not know is not published. `seen_at`: a WAL position past the commit of every row
    /// the claim saw. While the stream has not reached it, that older row may be one committed
    /// after this one and not streamed yet (two writers of one aggregate, the one with the lower
    /// seq committing last): the row is carried and claimed again shortly, and goes out in commit
    /// order once the stream brings the other. Once the stream has passed it, the older row is
    /// in no stream (skipped, or left by an earlier relay): the aggregate goes to the table,
    /// which publishes both in seq order. Meanwhile the row is parked (see `parked`): never to the
    /// table because the read-ahead is full or no commit came for a while (a stream reading one
    /// large transaction is moving, not stuck).
    pub fn claimed<S: BuildHasher>(
        &mut self,
        batch: BatchId,
        found: &std::collections::HashMap<Uuid, Found, S>,
        moved: &std::collections::HashMap<Uuid, AggregateKey, S>,
        prev: &std::collections::HashMap<Uuid, Uuid, S>,
        seen_at: u64,
    ) {
        let Some(at) = self.flight_index(batch) else {
            return;
        };
        let held = &self.held;
        let rows = &self.rows;
        // The rows this pipeline knows, with the aggregate the stream carried: streamed and not
        // resolved, or resolved by the last records (a claim that ran beside a record saw their
        // rows still pending). A row is behind one of its aggregate it knows only when that row
        // came in the same aggregate: one moved in from another is not in this aggregate's order.
        let known: HashMap<Uuid, &AggregateKey> = match prev.is_empty() {
            true => HashMap::new(),
            false => rows
                .values()
                .map(|t| (t.row.id, &t.row.aggregate))
                .chain(self.recent.iter().flatten().map(|(id, key)| (*id, key)))
                .collect(),
        };
        let behind_unknown = |id: &Uuid, key: &AggregateKey| {
            !prev.is_empty() && prev.get(id).is_some_and(|p| known.get(p) != Some(&key))
        };
        let streamed_to = self.streamed_to;
        let flight = &mut self.flights[at];
        // Per aggregate: after a row not visible, the rest is carried; after one pending, or when
        // the table holds the aggregate, the rest goes to the table (if visible).
        let mut carrying: HashSet<&AggregateKey> = HashSet::new();
        let mut to_table: HashSet<&AggregateKey> = HashSet::new();
        // Aggregates whose carry began with a row waiting for the stream: what it waits for (the
        // rows behind it park with it).
        let mut parking: HashMap<&AggregateKey, (Uuid, u64)> = HashMap::new();
        // Per row: the older row and the position it first waited for, if it waits now; what
        // parks it.
        let mut parks: Vec<(u64, Option<Park>, Option<Park>)> = Vec::new();
        flight.fate.clear();
        for index in &flight.rows {
            let tracked = &rows[index];
            let row = &tracked.row;
            let key = &row.aggregate;
            let state = found.get(&row.id).copied().unwrap_or(Found::NotVisible);
            // The sets are looked at only when not empty: hashing every row's aggregate is most of
            // this loop's cost, and in a steady stream they are.
            let in_set = |set: &HashSet<&AggregateKey>| !set.is_empty() && set.contains(key);
            let (mut park, mut waits) = (None, None);
            // Where the stream must be for the older row to be in no stream: where it was when
            // a claim first saw that row. An older row seen only now (committed since, a writer
            // with a lower seq committing after this row) is another row: this claim's position.
            let since = || match tracked.behind {
                Some((older, at)) if prev.get(&row.id) == Some(&older) => at,
                _ => seen_at,
            };
            let fate = if state == Found::Done {
                Fate::Done
            } else if state == Found::NotVisible || in_set(&carrying) {
                if !parking.is_empty() {
                    park = parking.get(key).copied();
                }
                carrying.insert(key);
                Fate::Carry
            } else if state == Found::Claimed
                && behind_unknown(&row.id, key)
                && !in_set(&to_table)
                && (held.is_empty() || !held.contains(key))
                && streamed_to < since()
            {
                // Behind a row not streamed yet, perhaps one committed after it: it waits until
                // the stream brings that row or passes the position where it would be.
                let since = since();
                park = prev.get(&row.id).map(|p| (*p, since));
                if let Some(p) = park {
                    parking.insert(key, p);
                }
                waits = park;
                carrying.insert(key);
                Fate::Carry
            } else if state == Found::Pending
                || in_set(&to_table)
                || (!held.is_empty() && held.contains(key))
                || behind_unknown(&row.id, key)
            {
                to_table.insert(key);
                flight.handed.insert(key.clone());
                if let Some(to) = (!moved.is_empty()).then(|| moved.get(&row.id)).flatten() {
                    flight.handed.insert(to.clone());
                }
                Fate::Table
            } else {
                Fate::Publish
            };
            flight.fate.push(fate);
            // Only rows that wait (a row enters a batch unparked): no per-row work otherwise.
            if waits.is_some() || park.is_some() {
                parks.push((*index, waits, park));
            }
        }
        flight.stage = Stage::Claimed;
        for (index, waits, park) in parks {
            if let Some(t) = self.rows.get_mut(&index) {
                if waits.is_some() {
                    t.behind = waits;
                }
                t.park = park;
            }
        }
    }

    /// `batch` publishes now (every batch before it is settled): the rows to publish, grouped by
    /// aggregate in stream order. Rows behind an earlier row of their aggregate that is carried
    /// are carried; behind one that went to the table (or with the table holding the aggregate),
    /// they go to the table.
    pub fn publish(&mut self, batch: BatchId) -> Vec<Vec<Uuid>> {
        let Some(at) = self.flight_index(batch) else {
            return Vec::new();
        };
        let (earlier, rest) = self.flights.make_contiguous().split_at_mut(at);
        let flight = &mut rest[0];
        // Per aggregate, the first row before this batch's last that is outside it and neither
        // published nor gone: a row of this batch behind it may not go out now.
        let last = flight.rows.last().copied().unwrap_or(0);
        // With what parks the first (a row behind a parked one parks with it: claimed again only
        // once that one may go).
        let mut carried_from: HashMap<&AggregateKey, (u64, Option<Park>)> = HashMap::new();
        for (index, t) in self.rows.range(..last) {
            if t.batch == Some(batch) {
                continue;
            }
            let fate = t
                .batch
                .and_then(|b| earlier.iter().find(|f| f.id == b))
                .and_then(|f| f.fate_of(*index));
            let blocks = match fate {
                // With the table: its aggregate is handed over (`handed`).
                Some(Fate::Published | Fate::Done | Fate::Table) => false,
                // Waiting, carried, in a later batch, or not settled.
                _ => true,
            };
            if blocks {
                carried_from
                    .entry(&t.row.aggregate)
                    .or_insert((*index, t.park));
            }
        }
        let handed = |key: &AggregateKey| {
            (!self.held.is_empty() && self.held.contains(key))
                || earlier
                    .iter()
                    .any(|f| !f.handed.is_empty() && f.handed.contains(key))
        };
        let mut groups: Vec<Vec<Uuid>> = Vec::new();
        let mut group_of: HashMap<&AggregateKey, usize> = HashMap::new();
        let mut parks: Vec<(u64, (Uuid, u64))> = Vec::new();
        for (index, fate) in flight.rows.iter().zip(flight.fate.iter_mut()) {
            if *fate != Fate::Publish {
                continue;
            }
            let row = &self.rows[index].row;
            let behind = match carried_from.is_empty() {
                true => None,
                false => carried_from
                    .get(&row.aggregate)
                    .filter(|(first, _)| first < index),
            };
            if let Some((_, park)) = behind {
                *fate = Fate::Carry;
                if let Some(park) = park {
                    parks.push((*index, *park));
                }
            } else if handed(&row.aggregate) {
                *fate = Fate::Table;
                flight.handed.insert(row.aggregate.clone());
            } else {
                match group_of.get(&row.aggregate) {
                    Some(&g) => groups[g].push(row.id),
                    None => {
                        group_of.insert(&row.aggregate, groups.len());
                        groups.push(vec![row.id]);
                    }
                }
            }
        }
        flight.stage = Stage::Published;
        for (index, park) in parks {
            if let Some(t) = self.rows.get_mut(&index) {
                t.park = Some(park);
            }
        }
        groups
    }

    /// The outcome of `batch`'s publish: `published` were acked; the others of its groups were
    /// not (failed, or held back behind a failure): their aggregates go to the table. Returns the
    /// aggregates the batch hands to the table (to record with it).
    pub fn settled<S: BuildHasher>(
        &mut self,
        batch: BatchId,
        published: &std::collections::HashSet<Uuid, S>,
    ) -> Vec<AggregateKey> {
        let Some(at) = self.flight_index(batch) else {
            return Vec::new();
        };
        let rows = &self.rows;
        let flight = &mut self.flights[at];
        for (index, fate) in flight.rows.iter().zip(flight.fate.iter_mut()) {
            if *fate == Fate::Publish {
                let row = &rows[index].row;
                if published.contains(&row.id) {
                    *fate = Fate::Published;
                } else {
                    *fate = Fate::Table;
                    flight.handed.insert(row.aggregate.clone());
                }
            }
        }
        let held = &self.held;
        flight
            .handed
            .iter()
            .filter(|k| !held.contains(*k))
            .cloned()
            .collect()
    }

    /// `batch` (the oldest in flight) is recorded and committed: its rows are resolved or back in
    /// the queue (carried), the aggregates it handed over are with the table.
    pub fn recorded(&mut self, batch: BatchId) {
        if self.flights.front().map(|f| f.id) != Some(batch) {
            return;
        }
        let Some(flight) = self.flights.pop_front() else {
            return;
        };
        let mut resolved = match self.recent.len() {
            0 | 1 => Vec::new(),
            _ => self.recent.pop_front().unwrap_or_default(),
        };
        resolved.clear();
        for (i, index) in flight.rows.iter().enumerate() {
            match flight.fate.get(i) {
                Some(Fate::Published | Fate::Table | Fate::Done) => {
                    if let Some(t) = self.rows.remove(index) {
                        resolved.push((t.row.id, t.row.aggregate));
                    }
                }
                _ => self.park(*index),
            }
        }
        self.recent.push_back(resolved);
        self.held.extend(flight.handed);
    }

    /// `batch` failed (its claim, publish or record): it and every batch after it go again (their
    /// rows back in the queue, in stream order; nothing they decided stands).
    pub fn failed(&mut self, batch: BatchId) {
        let Some(at) = self.flight_index(batch) else {
            return;
        };
        for flight in self.flights.split_off(at) {
            for index in flight.rows {
                self.requeue(index, false);
            }
        }
    }

    /// Where the next sweep round starts: after the last aggregate served (the rounds go round
    /// the durable record, `outbox_wal_deferred`, in key order).
    pub fn cursor(&self) -> AggregateKey {
        self.cursor.clone().unwrap_or_default()
    }

    /// A sweep serves `aggregates`, read from the durable record, which decides: they are held
    /// by the table whoever recorded them (this relay, another, a script), and memory, only a
    /// cache of that record, learns them. Those of which a streamed row is not resolved yet are
    /// frozen.
    pub fn serve(&mut self, aggregates: Vec<AggregateKey>) -> Round {
        if let Some(last) = aggregates.last() {
            self.cursor = Some(last.clone());
        }
        self.held.extend(aggregates.iter().cloned());
        let frozen = match aggregates.is_empty() {
            true => HashSet::new(),
            false => {
                let pending: HashSet<&AggregateKey> =
                    self.rows.values().map(|t| &t.row.aggregate).collect();
                aggregates
                    .iter()
                    .filter(|k| pending.contains(k))
                    .cloned()
                    .collect()
            }
        };
        Round { aggregates, frozen }
    }

    /// A sweep's transaction took these aggregates back (the table has no pending row of them).
    pub fn taken_back(&mut self, aggregates: &[AggregateKey]) {
        for key in aggregates {
            self.held.remove(key);
        }
    }

    /// The position the slot may confirm now, if it moved on since the last one: the end of the
    /// last commit before every unresolved row, or, with nothing unresolved and no transaction
    /// open, the last keepalive's position.
    pub fn confirm(&mut self) -> Option<u64> {
        let first_unresolved = self.rows.keys().next().copied().unwrap_or(self.next_index);
        let mut position = None;
        while let Some(&(boundary, end)) = self.commits.front() {
            if boundary > first_unresolved {
                break;
            }
            position = Some(end);
            self.commits.pop_front();
        }
        if self.rows.is_empty() && !self.in_tx && self.commits.is_empty() {
            position = position.max(self.idle.take());
        }
        match position {
            Some(p) if p > self.confirmed => {
                self.confirmed = p;
                Some(p)
            }
            _ => None,
        }
    }

    /// The row at stream `index` has had its fate decided by its batch: published, gone, or with
    /// the table (its aggregate handed over, the row visible there).
    fn decided(&self, index: u64, t: &Tracked) -> bool {
        t.batch
            .and_then(|b| self.flights.iter().find(|f| f.id == b))
            .and_then(|f| f.fate_of(index))
            .is_some_and(|f| matches!(f, Fate::Published | Fate::Done | Fate::Table))
    }

    /// The table holds `key`, or a batch in flight hands it over.
    fn with_table(&self, key: &AggregateKey) -> bool {
        (!self.held.is_empty() && self.held.contains(key))
            || self
                .flights
                .iter()
                .any(|f| !f.handed.is_empty() && f.handed.contains(key))
    }

    fn flight_index(&self, batch: BatchId) -> Option<usize> {
        self.flights.iter().position(|f| f.id == batch)
    }

    fn requeue(&mut self, index: u64, carried: bool) {
        if let Some(t) = self.rows.get_mut(&index) {
            t.batch = None;
            t.park = None;
            t.carried = carried;
            self.waiting.insert(index);
            if !carried {
                self.fresh += 1;
            }
            self.queued.0 += 1;
            self.queued.1 = self.queued.1.saturating_add(t.row.size);
        }
    }
}

/// `--transactions atomic`: the rows a completion takes from the table (the rest of a transaction
/// the claim holds part of) keep the stream's order. A taken row the stream brought waits while an
/// earlier-streamed row of its aggregate is neither in the claim nor taken and not decided
/// (published, gone, with the table): streamed before it, it committed before it, and may not be
/// visible yet, which the completion's own check cannot see. A taken row the stream has not
/// brought (a restart streams again from the slot's position, the sweep may run first) waits
/// unless the table holds its aggregate, whose order is the table's; then only while a streamed
/// row of that aggregate is undecided, as the sweep freezes such aggregates. Taken rows the
/// stream brought join their groups in stream order. Asked only when a completion took rows:
/// one walk over the rows streamed.
impl CommitOrder for Pipeline {
    fn taken(
        &self,
        claimed: &std::collections::HashSet<Uuid>,
        taken: &[(Uuid, &AggregateKey)],
    ) -> TakenOrder {
        let keys: HashSet<&AggregateKey> = taken.iter().map(|(_, key)| *key).collect();
        let ids: HashSet<Uuid> = taken.iter().map(|(id, _)| *id).collect();
        let mut out = TakenOrder::default();
        // Per aggregate taken from: the first streamed row that the taken rows may not pass.
        let mut first: HashMap<&AggregateKey, u64> = HashMap::new();
        for (index, t) in &self.rows {
            let id = t.row.id;
            if ids.contains(&id) {
                out.position.insert(id, *index);
                continue;
            }
            let key = &t.row.aggregate;
            if !keys.contains(key) {
                continue;
            }
            if claimed.contains(&id) {
                out.position.insert(id, *index);
            } else if !first.contains_key(key) && !self.decided(*index, t) {
                first.insert(key, *index);
            }
        }
        for (id, key) in taken {
            let wait = match (out.position.get(id), first.get(key)) {
                (Some(at), Some(before)) => before < at,
                (Some(_), None) => false,
                (None, before) => before.is_some() || !self.with_table(key),
            };
            if wait {
                out.wait.insert(*id);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
