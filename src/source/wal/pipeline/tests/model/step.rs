//! The model's steps: what the world and the relay do, one at a time.

use super::*;

impl World {
    pub(super) fn step(&mut self, p: &mut Pipeline, op: Op) {
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
                let deferring = p.settled(id, &acked.iter().copied().collect::<HashSet<_>>());
                self.batches[at].published = Some((acked, failed, deferring));
            }
            Op::Record(fails) => {
                let Some(b) = self.batches.front() else {
                    return self.after_step(p);
                };
                let Some((acked, failed, deferring)) = &b.published else {
                    return self.after_step(p);
                };
                let id = b.id;
                if fails {
                    p.failed(id);
                    self.batches.clear();
                    return self.after_step(p);
                }
                let (acked, failed, deferring) = (acked.clone(), failed.clone(), deferring.clone());
                for a in acked {
                    let i = self.by_id[&a];
                    self.rows[i].processed = true;
                }
                for f in failed {
                    self.failure(self.by_id[&f]);
                }
                self.deferred.extend(deferring);
                p.recorded(id);
                self.batches.pop_front();
            }
            Op::Sweep => self.sweep_read(p),
            Op::Fallback => self.fallback(p),
            Op::Restart => {
                // Batches in flight and a sweep round running roll back; the stream goes again
                // from the slot's position; the new pipeline knows what the database says is deferred.
                self.batches.clear();
                self.sweeping = None;
                self.sent = 0;
                let found: Vec<AggregateKey> = self
                    .rows
                    .iter()
                    .filter(|r| r.pending() && !r.eligible)
                    .map(|r| key(r.aggregate))
                    .collect();
                let mut deferred = self.deferred.clone();
                deferred.extend(found);
                if self.defences.record_at_start {
                    self.deferred.clone_from(&deferred);
                }
                *p = Pipeline::new(deferred);
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
}
