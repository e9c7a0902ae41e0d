//! What the model checks after every step and once every trouble is gone.

use super::*;

impl World {
    /// After every step.
    pub(super) fn check(&self, p: &Pipeline) {
        // Nothing the slot confirmed past is known only in memory: each such streamed row is
        // processed, or pending and visible in the table with its aggregate deferred
        // (rows changed by hand after their commit are the fallback's to find).
        let deferred_aggs: HashSet<u32> = self.deferred.iter().map(agg).collect();
        for (i, r) in self.rows.iter().enumerate() {
            if r.end <= self.confirmed && r.streamed && r.moved_at.is_none() && !r.deleted {
                let with_table = r.visible && deferred_aggs.contains(&r.aggregate);
                assert!(
                    r.processed || with_table,
                    "row {i} ({r:?}) lost: the slot confirmed {} past it",
                    self.confirmed
                );
            }
        }
        // The pipeline's idea of the table's aggregates is the table's.
        assert_eq!(
            p.deferred(),
            &self.deferred,
            "the deferred aggregates in memory and in the record differ"
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
    pub(super) fn settle_all(&mut self, p: &mut Pipeline) {
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
                && p.deferred().is_empty()
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
        assert!(p.deferred().is_empty(), "aggregates left with the table");
        assert_eq!(p.in_flight(), 0);
        assert_eq!(
            self.confirmed, self.wal,
            "the slot confirms the last commit"
        );
    }
}
