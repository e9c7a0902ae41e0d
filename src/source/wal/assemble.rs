//! Each streamed insert's place in its transaction. The stream carries a transaction's inserts
//! between its Begin and its Commit, in the order they were written; the count is known only at
//! the Commit. [`Assembler`] holds a transaction's changes until then (up to a limit, which bounds
//! the memory), numbering each insert and telling the buffered ones the count. Pure: the stream's pump
//! feeds it and sends on what it returns, in order.
//!
//! A transaction larger than the limit is passed on as it comes past it: its first inserts go
//! without the count (their index still exact), the ones still buffered at the Commit with it, the
//! last one always. Nothing is reordered and no change is buffered past its transaction's Commit, so
//! the positions the relay confirms are those it would confirm without the hold.

use crate::source::wal::pipeline::Change;

/// See the module documentation.
pub(crate) struct Assembler {
    /// The inserts buffered at most (at least 1: the last insert waits for the Commit).
    limit: usize,
    /// Inserts of the current transaction so far.
    index: u64,
    /// Changes buffered since the oldest insert not passed on, in stream order.
    buffered: Vec<Change>,
    /// Inserts among `buffered`.
    buffered_inserts: usize,
}

impl Assembler {
    pub fn new(limit: usize) -> Assembler {
        Assembler {
            limit: limit.max(1),
            index: 0,
            buffered: Vec::new(),
            buffered_inserts: 0,
        }
    }

    /// Takes the next change of the stream; appends to `out` what may be passed on now.
    pub fn advance(&mut self, change: Change, out: &mut Vec<Change>) {
        match change {
            Change::Begin => {
                // A Begin without the Commit before it (not sent by the server): pass the
                // buffered ones on as they are.
                self.release(out);
                self.index = 0;
                out.push(Change::Begin);
            }
            Change::Insert(mut c) => {
                self.index += 1;
                if let Some(t) = &mut c.transaction {
                    t.index = self.index;
                }
                self.buffered.push(Change::Insert(c));
                self.buffered_inserts += 1;
                if self.buffered_inserts > self.limit {
                    // Too many to hold: everything up to the newest insert goes without the
                    // count; the newest waits (it may be the last).
                    let newest = self.buffered.pop();
                    self.release(out);
                    if let Some(newest) = newest {
                        self.buffered.push(newest);
                        self.buffered_inserts = 1;
                    }
                }
            }
            Change::Commit { end } => {
                let events = self.index;
                for buffered in &mut self.buffered {
                    if let Change::Insert(c) = buffered {
                        if let Some(t) = &mut c.transaction {
                            t.events = Some(events);
                        }
                    }
                }
                self.release(out);
                self.index = 0;
                out.push(Change::Commit { end });
            }
            idle @ Change::Idle { .. } => {
                // Behind the buffered inserts: a keepalive's position never passes them.
                if self.buffered.is_empty() {
                    out.push(idle);
                } else {
                    self.buffered.push(idle);
                }
            }
        }
    }

    fn release(&mut self, out: &mut Vec<Change>) {
        out.append(&mut self.buffered);
        self.buffered_inserts = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::TransactionPosition;
    use crate::source::wal::pipeline::Candidate;

    fn insert(n: u128) -> Change {
        Change::Insert(Candidate {
            transaction: Some(TransactionPosition {
                id: 7,
                index: 0,
                events: None,
            }),
            id: uuid::Uuid::from_u128(n),
            aggregate: ("a".into(), "1".into()),
            xid: 7,
            size: 10,
            content: None,
        })
    }

    /// (index, count) of the inserts, `None` for other changes.
    fn positions(changes: &[Change]) -> Vec<Option<(u64, Option<u64>)>> {
        changes
            .iter()
            .map(|c| match c {
                Change::Insert(c) => c.transaction.map(|t| (t.index, t.events)),
                _ => None,
            })
            .collect()
    }

    fn run(limit: usize, input: Vec<Change>) -> Vec<Change> {
        let mut a = Assembler::new(limit);
        let mut out = Vec::new();
        for change in input {
            a.advance(change, &mut out);
        }
        out
    }

    #[test]
    fn a_transaction_within_the_limit_is_told_its_count() {
        let out = run(
            10,
            vec![
                Change::Begin,
                insert(1),
                insert(2),
                insert(3),
                Change::Commit { end: 9 },
                Change::Begin,
                insert(4),
                Change::Commit { end: 12 },
            ],
        );
        assert_eq!(
            positions(&out),
            vec![
                None,
                Some((1, Some(3))),
                Some((2, Some(3))),
                Some((3, Some(3))),
                None,
                None,
                Some((1, Some(1))),
                None,
            ]
        );
    }

    #[test]
    fn nothing_passes_before_the_commit_within_the_limit() {
        let mut a = Assembler::new(10);
        let mut out = Vec::new();
        a.advance(Change::Begin, &mut out);
        a.advance(insert(1), &mut out);
        a.advance(Change::Idle { wal_end: 100 }, &mut out);
        a.advance(insert(2), &mut out);
        assert_eq!(
            out,
            vec![Change::Begin],
            "the keepalive waits behind the inserts"
        );
        a.advance(Change::Commit { end: 50 }, &mut out);
        assert_eq!(out.len(), 5);
        assert_eq!(out[2], Change::Idle { wal_end: 100 }, "order kept");
        assert_eq!(out[4], Change::Commit { end: 50 });
    }

    #[test]
    fn a_larger_transaction_passes_in_order_with_exact_indexes_and_its_last_counted() {
        let mut input = vec![Change::Begin];
        input.extend((1..=7).map(insert));
        input.push(Change::Commit { end: 99 });
        for limit in [1, 2, 3, 6] {
            let out = run(limit, input.clone());
            let ids: Vec<_> = out
                .iter()
                .filter_map(|c| match c {
                    Change::Insert(c) => Some(c.id.as_u128()),
                    _ => None,
                })
                .collect();
            assert_eq!(ids, (1..=7).collect::<Vec<_>>(), "limit {limit}: in order");
            let p: Vec<_> = positions(&out).into_iter().flatten().collect();
            assert_eq!(
                p.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
                (1..=7).collect::<Vec<_>>()
            );
            assert_eq!(
                p.last(),
                Some(&(7, Some(7))),
                "limit {limit}: the last is counted"
            );
            assert!(
                p.iter().all(|(_, n)| n.is_none() || *n == Some(7)),
                "limit {limit}: a count is never wrong"
            );
            assert_eq!(out.first(), Some(&Change::Begin));
            assert_eq!(out.last(), Some(&Change::Commit { end: 99 }));
        }
    }

    #[test]
    fn rows_without_a_txid_pass_without_a_position() {
        let mut c = match insert(1) {
            Change::Insert(c) => c,
            _ => unreachable!(),
        };
        c.transaction = None;
        let out = run(
            4,
            vec![
                Change::Begin,
                Change::Insert(c),
                insert(2),
                Change::Commit { end: 3 },
            ],
        );
        assert_eq!(positions(&out), vec![None, None, Some((2, Some(2))), None]);
    }
}
