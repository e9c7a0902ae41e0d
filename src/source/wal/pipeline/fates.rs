//! Each row's fate in its batch: decided by the claim, revised when the batch publishes, settled
//! by the acks; then the batch recorded (its rows resolved or carried) or failed (back in the
//! queue).

use std::hash::BuildHasher;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use uuid::Uuid;

use super::{BatchId, Fate, Found, Park, Pipeline, Stage};
use crate::event::AggregateKey;

impl Pipeline {
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
        let deferred = &self.deferred;
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
        // the aggregate is deferred, the rest goes to the table (if visible).
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
                && (deferred.is_empty() || !deferred.contains(key))
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
                || (!deferred.is_empty() && deferred.contains(key))
                || behind_unknown(&row.id, key)
            {
                to_table.insert(key);
                flight.deferring.insert(key.clone());
                if let Some(to) = (!moved.is_empty()).then(|| moved.get(&row.id)).flatten() {
                    flight.deferring.insert(to.clone());
                }
                Fate::Deferred
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
                // With the table: its aggregate is deferred (`deferring`).
                Some(Fate::Published | Fate::Done | Fate::Deferred) => false,
                // Waiting, carried, in a later batch, or not settled.
                _ => true,
            };
            if blocks {
                carried_from
                    .entry(&t.row.aggregate)
                    .or_insert((*index, t.park));
            }
        }
        let is_deferred = |key: &AggregateKey| {
            (!self.deferred.is_empty() && self.deferred.contains(key))
                || earlier
                    .iter()
                    .any(|f| !f.deferring.is_empty() && f.deferring.contains(key))
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
            } else if is_deferred(&row.aggregate) {
                *fate = Fate::Deferred;
                flight.deferring.insert(row.aggregate.clone());
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
    /// not (failed, or put back behind a failure): their aggregates go to the table. Returns the
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
                    *fate = Fate::Deferred;
                    flight.deferring.insert(row.aggregate.clone());
                }
            }
        }
        let deferred = &self.deferred;
        flight
            .deferring
            .iter()
            .filter(|k| !deferred.contains(*k))
            .cloned()
            .collect()
    }

    /// `batch` (the oldest in flight) is recorded and committed: its rows are resolved or back in
    /// the queue (carried), the aggregates it deferred are with the table.
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
                Some(Fate::Published | Fate::Deferred | Fate::Done) => {
                    if let Some(t) = self.rows.remove(index) {
                        resolved.push((t.row.id, t.row.aggregate));
                    }
                }
                _ => self.park(*index),
            }
        }
        self.recent.push_back(resolved);
        self.deferred.extend(flight.deferring);
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
}
