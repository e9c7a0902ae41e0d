//! `--transactions atomic`: which of a batch's events go out, as which atomic batches, in which
//! order. Pure: the publisher performs the plan, the claim puts back what it holds.
//!
//! A transaction goes out as one unit when the batch holds all its events (the claim completes
//! transactions it holds part of, `complete_transactions.sql`) and none of them waits behind an
//! event of its aggregate that is not going out. Anything else is postponed, put back unpublished and
//! claimed again; holding an event holds the rest of its aggregate in the batch, which may hold
//! another transaction, and so on until nothing changes. A transaction larger than one atomic
//! batch may be (`limit`) is published in parts, each an atomic batch: it is *split*, counted
//! and logged, never stuck.

use std::collections::HashMap;

use crate::event::OutboxEvent;
use crate::source::store::Completion;

/// An event's place in a claim: (group, index in the group).
pub(crate) type At = (usize, usize);

/// What a batch publishes in atomic mode.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The units, each an atomic batch (or a lone message), its events in write order.
    pub units: Vec<Unit>,
    /// Units to publish one after the other (they share aggregates), as indexes into `units`;
    /// chains go out side by side.
    pub chains: Vec<Vec<usize>>,
    /// Transactions over `limit` events, published in parts.
    pub split: Vec<u64>,
    /// Events postponed (put back unpublished).
    pub postponed: usize,
}

/// Events published together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unit {
    pub events: Vec<At>,
    /// The transaction, when the unit is (part of) one with more than one event.
    pub txid: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// All its events are here: one unit.
    Whole,
    /// More events than one atomic batch takes: what is here goes out in parts.
    Split,
    /// Not all here (or not all can go): postponed.
    Postponed,
}

/// Plans `groups` (each one aggregate's events in publish order), completed by the claim
/// (`completion`: events that wait behind a pending event of their aggregate outside the batch,
/// transactions not all taken, transactions too large). `limit`: the most events one atomic batch
/// may hold.
pub(crate) fn plan(groups: &[Vec<OutboxEvent>], completion: &Completion, limit: usize) -> Plan {
    let limit = limit.max(1);
    let mut status: HashMap<u64, Status> = HashMap::new();
    for e in groups.iter().flatten() {
        if let Some(t) = multi(e) {
            let s = if completion.split.contains(&t) {
                Status::Split
            } else if completion.incomplete.contains(&t) {
                Status::Postponed
            } else {
                Status::Whole
            };
            status.insert(t, s);
        }
    }
    let blocked = &completion.blocked;
    // Each group goes out up to its first postponed event; a whole transaction with an event past
    // that point is postponed. Until nothing changes (each round postpones at least one more
    // transaction).
    let mut cut: Vec<usize> = vec![0; groups.len()];
    loop {
        let mut changed = false;
        for (g, group) in groups.iter().enumerate() {
            cut[g] = group
                .iter()
                .position(|e| {
                    blocked.contains(&e.id)
                        || multi(e).is_some_and(|t| status.get(&t) == Some(&Status::Postponed))
                })
                .unwrap_or(group.len());
            for e in &group[cut[g]..] {
                if let Some(t) = multi(e) {
                    if status.get(&t) == Some(&Status::Whole) {
                        status.insert(t, Status::Postponed);
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut out = Plan {
        postponed: groups.iter().zip(&cut).map(|(g, c)| g.len() - c).sum(),
        ..Plan::default()
    };
    // Units: a transaction's events in write order (seq); a lone event alone.
    let mut of_tx: HashMap<u64, Vec<At>> = HashMap::new();
    let mut order: Vec<u64> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for (i, e) in group[..cut[g]].iter().enumerate() {
            match multi(e).filter(|t| status.contains_key(t)) {
                Some(t) => {
                    let events = of_tx.entry(t).or_default();
                    if events.is_empty() {
                        order.push(t);
                    }
                    events.push((g, i));
                }
                None => out.units.push(Unit {
                    events: vec![(g, i)],
                    txid: None,
                }),
            }
        }
    }
    for t in order {
        let Some(mut events) = of_tx.remove(&t) else {
            continue;
        };
        events.sort_by_key(|&(g, i)| groups[g][i].seq);
        if status.get(&t) == Some(&Status::Split) {
            out.split.push(t);
            for part in events.chunks(limit) {
                out.units.push(Unit {
                    events: part.to_vec(),
                    txid: Some(t),
                });
            }
        } else {
            out.units.push(Unit {
                events,
                txid: Some(t),
            });
        }
    }
    out.chains = chains(groups, &out.units);
    out
}

/// The transaction of an event that has siblings (a lone event is its own unit either way).
fn multi(e: &OutboxEvent) -> Option<u64> {
    e.transaction
        .filter(|t| t.events.is_none_or(|n| n > 1))
        .map(|t| t.id)
}

/// Units that share a group, transitively, form a chain, ordered so that each group's events go
/// out in the group's order. Where two transactions interleave within one aggregate (each has an
/// event before one of the other's), neither order keeps both: the one whose earliest event
/// comes first goes first.
fn chains(groups: &[Vec<OutboxEvent>], units: &[Unit]) -> Vec<Vec<usize>> {
    let mut unit_of: HashMap<At, usize> = HashMap::new();
    for (u, unit) in units.iter().enumerate() {
        for &at in &unit.events {
            unit_of.insert(at, u);
        }
    }
    // Union-find over units sharing a group.
    let mut parent: Vec<usize> = (0..units.len()).collect();
    fn root(parent: &mut [usize], mut u: usize) -> usize {
        while parent[u] != u {
            parent[u] = parent[parent[u]];
            u = parent[u];
        }
        u
    }
    // Per group, its units in the group's order (consecutive repeats once).
    let mut sequences: Vec<Vec<usize>> = Vec::with_capacity(groups.len());
    for (g, group) in groups.iter().enumerate() {
        let mut seq: Vec<usize> = Vec::new();
        for i in 0..group.len() {
            let Some(&u) = unit_of.get(&(g, i)) else {
                break;
            };
            if seq.last() != Some(&u) {
                seq.push(u);
            }
        }
        for w in seq.windows(2) {
            let (a, b) = (root(&mut parent, w[0]), root(&mut parent, w[1]));
            if a != b {
                parent[a] = b;
            }
        }
        sequences.push(seq);
    }
    // Within a chain: a unit is ready when every unit before it in each of its groups is out;
    // when none is (interleaved transactions), the one with the earliest event goes.
    let earliest: Vec<i64> = units
        .iter()
        .map(|u| {
            u.events
                .iter()
                .map(|&(g, i)| groups[g][i].seq)
                .min()
                .unwrap_or(i64::MAX)
        })
        .collect();
    let mut waiting_on: Vec<usize> = vec![0; units.len()];
    let mut after: Vec<Vec<usize>> = vec![Vec::new(); units.len()];
    for seq in &sequences {
        for (k, &u) in seq.iter().enumerate() {
            for &before in &seq[..k] {
                if before != u {
                    waiting_on[u] += 1;
                    after[before].push(u);
                }
            }
        }
    }
    let mut by_root: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut roots: Vec<usize> = Vec::new();
    for u in 0..units.len() {
        let r = root(&mut parent, u);
        let members = by_root.entry(r).or_default();
        if members.is_empty() {
            roots.push(r);
        }
        members.push(u);
    }
    let mut done = vec![false; units.len()];
    let mut out = Vec::with_capacity(roots.len());
    for r in roots {
        let members = by_root.remove(&r).unwrap_or_default();
        let mut chain = Vec::with_capacity(members.len());
        while chain.len() < members.len() {
            let pick = members
                .iter()
                .copied()
                .filter(|&u| !done[u])
                .min_by_key(|&u| (waiting_on[u] != 0, earliest[u]));
            let Some(u) = pick else { break };
            done[u] = true;
            chain.push(u);
            for &next in &after[u] {
                waiting_on[next] = waiting_on[next].saturating_sub(1);
            }
        }
        out.push(chain);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::TransactionPosition;
    use std::collections::HashSet;
    use uuid::Uuid;

    fn none() -> Completion {
        Completion::default()
    }

    fn incomplete(t: u64) -> Completion {
        Completion {
            incomplete: [t].into(),
            ..Completion::default()
        }
    }

    /// Event `seq` of aggregate `a` in transaction `tx` of `n` events (`tx` 0: none).
    fn ev(a: &str, seq: i64, tx: u64, n: u64) -> OutboxEvent {
        OutboxEvent {
            id: Uuid::from_u128(seq as u128),
            seq,
            aggregate_type: "t".into(),
            aggregate_id: a.into(),
            event_type: "e".into(),
            payload: bytes::Bytes::from_static(b"{}"),
            headers: Default::default(),
            attempts: 0,
            created_at: crate::timestamp::Timestamp::now(),
            defect: None,
            transaction: (tx != 0).then_some(TransactionPosition {
                id: tx,
                index: 0,
                events: Some(n),
            }),
        }
    }

    fn seqs(groups: &[Vec<OutboxEvent>], plan: &Plan) -> Vec<Vec<Vec<i64>>> {
        plan.chains
            .iter()
            .map(|c| {
                c.iter()
                    .map(|&u| {
                        plan.units[u]
                            .events
                            .iter()
                            .map(|&(g, i)| groups[g][i].seq)
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn whole_transactions_go_as_units_and_chain_where_they_share_aggregates() {
        let groups = vec![
            vec![ev("a", 1, 7, 2), ev("a", 4, 8, 1)],
            vec![ev("b", 2, 7, 2)],
            vec![ev("c", 3, 0, 0)],
        ];
        let p = plan(&groups, &none(), 1000);
        assert_eq!(
            seqs(&groups, &p),
            vec![vec![vec![1, 2], vec![4]], vec![vec![3]]]
        );
        assert_eq!(p.postponed, 0);
    }

    #[test]
    fn a_partial_transaction_is_postponed_with_what_follows_it_in_its_aggregates() {
        // tx 7 has 3 events, only 2 here: postponed; tx 9 follows it in "a": postponed too, and with it
        // its event in "c" and what follows that.
        let groups = vec![
            vec![ev("a", 1, 7, 3), ev("a", 5, 9, 2)],
            vec![ev("b", 2, 7, 3)],
            vec![ev("c", 3, 9, 2), ev("c", 6, 0, 0)],
            vec![ev("d", 4, 0, 0)],
        ];
        let p = plan(&groups, &incomplete(7), 1000);
        assert_eq!(seqs(&groups, &p), vec![vec![vec![4]]]);
        assert_eq!(p.postponed, 5);
    }

    #[test]
    fn a_blocked_event_holds_its_transaction() {
        let groups = vec![vec![ev("a", 1, 7, 2)], vec![ev("b", 2, 7, 2)]];
        let blocked = Completion {
            blocked: [Uuid::from_u128(2)].into(),
            ..Completion::default()
        };
        let p = plan(&groups, &blocked, 1000);
        assert!(p.units.is_empty());
        assert_eq!(p.postponed, 2);
    }

    #[test]
    fn a_transaction_over_the_limit_goes_in_parts_in_write_order() {
        let groups = vec![
            vec![ev("a", 1, 7, 5), ev("a", 3, 7, 5), ev("a", 5, 7, 5)],
            vec![ev("b", 2, 7, 5), ev("b", 4, 7, 5)],
        ];
        let split = Completion {
            split: [7].into(),
            ..Completion::default()
        };
        let p = plan(&groups, &split, 2);
        assert_eq!(p.split, vec![7]);
        assert_eq!(
            seqs(&groups, &p),
            vec![vec![vec![1, 2], vec![3, 4], vec![5]]]
        );
    }

    #[test]
    fn group_order_rules_where_it_differs_from_seq_order() {
        // The wal source's groups follow commit order: tx 8 (seq 5) committed before tx 7.
        let groups = vec![
            vec![ev("a", 5, 8, 1), ev("a", 1, 7, 2)],
            vec![ev("b", 2, 7, 2)],
        ];
        let p = plan(&groups, &none(), 1000);
        assert_eq!(seqs(&groups, &p), vec![vec![vec![5], vec![1, 2]]]);
    }

    #[test]
    fn interleaved_transactions_go_by_their_earliest_event() {
        let groups = vec![vec![
            ev("a", 1, 7, 2),
            ev("a", 2, 8, 2),
            ev("a", 3, 7, 2),
            ev("a", 4, 8, 2),
        ]];
        let p = plan(&groups, &none(), 1000);
        assert_eq!(seqs(&groups, &p), vec![vec![vec![1, 3], vec![2, 4]]]);
    }

    #[test]
    fn every_event_is_planned_once_or_postponed() {
        // Random claims: each event is in exactly one unit or postponed, units hold whole
        // transactions (or parts of split ones), and each group goes out as a prefix.
        let mut rng = fastrand::Rng::with_seed(37);
        for _ in 0..500 {
            let mut groups: Vec<Vec<OutboxEvent>> =
                (0..rng.usize(1..5)).map(|_| Vec::new()).collect();
            let mut seq = 0;
            let mut counts: HashMap<u64, u64> = HashMap::new();
            let mut rows = Vec::new();
            for _ in 0..rng.usize(1..12) {
                seq += 1;
                let tx = rng.u64(0..4);
                *counts.entry(tx).or_default() += 1;
                rows.push((rng.usize(0..groups.len()), seq, tx));
            }
            for (g, seq, tx) in rows {
                let n = counts[&tx];
                groups[g].push(ev(&g.to_string(), seq, tx, n));
            }
            let limit = rng.usize(1..4);
            // Transaction 3 is sometimes not all here, sometimes too large.
            let completion = match rng.u8(0..3) {
                0 => none(),
                1 => incomplete(3),
                _ => Completion {
                    split: [3].into(),
                    ..Completion::default()
                },
            };
            let p = plan(&groups, &completion, limit);
            let mut seen = HashSet::new();
            for u in &p.units {
                // A split transaction's parts fit the limit.
                if u.txid.is_some_and(|t| p.split.contains(&t)) {
                    assert!(u.events.len() <= limit);
                }
                for at in &u.events {
                    assert!(seen.insert(*at));
                }
            }
            assert_eq!(
                seen.len() + p.postponed,
                groups.iter().map(Vec::len).sum::<usize>()
            );
            for (g, group) in groups.iter().enumerate() {
                let out = (0..group.len())
                    .take_while(|i| seen.contains(&(g, *i)))
                    .count();
                assert!((out..group.len()).all(|i| !seen.contains(&(g, i))));
            }
            let planned: usize = p.chains.iter().map(Vec::len).sum();
            assert_eq!(planned, p.units.len());
        }
    }
}
