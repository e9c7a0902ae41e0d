//! The wal source's pipeline as a pure state machine: what the stream has sent, which rows are in
//! which batch, which deferred aggregates, and how far the slot may confirm. The async
//! driver (`driver`) performs what it decides (claim, publish, record, sweep, confirm) and feeds
//! the results back; nothing here does I/O.
//!
//! A streamed row leaves the pipeline only when it is *resolved*:
//! - published (acked, and its batch recorded), or gone already (published before, or deleted);
//! - or with the table: its aggregate is deferred in a recorded transaction and the row
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
//! pending (locked elsewhere, dead-lettered), the aggregate is deferred already, or the stream
//! passed the WAL position the claim read after seeing an older row it had not brought. While
//! the stream has not, the row is parked outside the read-ahead (its content dropped, claimed
//! again when the stream brings that row or passes the position), so waiting never stops the
//! stream that will end it, and a moving stream is never taken for a stuck one. The same holds for
//! the rows an atomic completion takes from the table (the rest of a transaction a claim holds
//! part of): they wait for what the stream brought before them (`CommitOrder`).

mod atomic;
mod fates;
mod inputs;
mod parking;
mod sweep;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use foldhash::{HashMap, HashSet};
use uuid::Uuid;

use crate::event::AggregateKey;
pub(crate) use inputs::{BatchId, Candidate, Change, Cut, Found, Round, Streamed};

/// What becomes of a row in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Claimed: to publish (unless left out when its batch publishes).
    Publish,
    /// Acked.
    Published,
    /// Its aggregate is with the table, and the row is visible there.
    Deferred,
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
    deferring: BTreeSet<AggregateKey>,
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
    /// The deferred aggregates (recorded in `outbox_wal_deferred`).
    deferred: BTreeSet<AggregateKey>,
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
    /// Starts with the deferred aggregates.
    pub fn new(deferred: impl IntoIterator<Item = AggregateKey>) -> Pipeline {
        Pipeline {
            deferred: deferred.into_iter().collect(),
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

    /// The deferred aggregates.
    pub fn deferred(&self) -> &BTreeSet<AggregateKey> {
        &self.deferred
    }

    /// The position the slot was last told to confirm: every row committed before it is resolved.
    pub fn confirmed(&self) -> u64 {
        self.confirmed
    }

    /// The ids of the rows streamed and not resolved (waiting, carried or in a batch).
    pub fn tracked(&self) -> HashSet<Uuid> {
        self.rows.values().map(|t| t.row.id).collect()
    }

    /// Aggregates deferred outside a batch (recorded already: the stream's fallback
    /// found rows of them that no stream carried).
    pub fn defer(&mut self, keys: impl IntoIterator<Item = AggregateKey>) {
        self.deferred.extend(keys);
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
            deferring: BTreeSet::new(),
        });
        Some(Cut { batch: id, rows })
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

#[cfg(test)]
mod tests;
