//! The model's sweep rounds, the table's seq order, and the stream's fallback.

use std::collections::BTreeSet;

use super::*;
use crate::source::wal::fallback::suspects;

impl World {
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

    /// What a sweep's record tells the pipeline (`sweep.rs`): the aggregates it deferred (rows
    /// found moved under it) and those it undeferred.
    fn sweep_recorded(p: &mut Pipeline, defer: Vec<AggregateKey>, undefer: &[AggregateKey]) {
        p.defer(defer);
        p.undefer(undefer);
    }

    /// A sweep round up to its claim (`store.rs`): what it serves, then of each aggregate not
    /// frozen whose oldest pending row may go, the eligible rows in seq order (up to a share).
    pub(super) fn sweep_read(&mut self, p: &mut Pipeline) {
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
    /// the aggregate since the read defer their new aggregate too; rows held
    /// elsewhere or not eligible stop their aggregate; the round takes back the aggregates it
    /// found with nothing pending, or whose every pending row it published.
    pub(super) fn sweep_claim(&mut self, p: &mut Pipeline, swept: Swept) {
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
    /// and publishable, defer their aggregates; then the next look.
    pub(super) fn fallback(&mut self, p: &mut Pipeline) {
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
            p.defer(keys);
        }
        // Per aggregate not deferred, its oldest pending row, when it may go now.
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
}
