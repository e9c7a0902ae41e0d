//! What became of the candidates a claim by id did not take ([`RowState`]), and the claim grouped
//! by it: where each aggregate stops, what goes to the table and what is carried to the next
//! claim.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use uuid::Uuid;

use crate::event::{AggregateKey, OutboxEvent};
use crate::source::wal::pipeline::Candidate;

/// What became of a candidate the claim did not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RowState {
    /// Still to publish, but held elsewhere or not eligible now.
    Pending,
    /// Pending in another aggregate than the candidate's (changed after its insert).
    Moved(AggregateKey),
    /// Published already (a replay), or deleted.
    Done,
    /// Its transaction is not visible yet.
    NotVisible,
}

/// A claim by id, grouped (see [`group_candidates`]).
#[derive(Debug, Default)]
pub(super) struct Grouping {
    pub(super) groups: Vec<Vec<OutboxEvent>>,
    /// Aggregates to hand to the table.
    pub(super) defer: Vec<AggregateKey>,
    /// Candidates to claim again shortly, in order.
    pub(super) carry: Vec<Candidate>,
}

/// Groups the claimed events by aggregate in candidate order. `states` says what became of each
/// candidate not claimed. An aggregate stops at its first candidate that:
/// - is still pending but was not claimed (held by another session, not eligible): the aggregate
///   is handed to the table;
/// - is not visible yet: its transaction's commit reached the stream before the transaction
///   became visible to other sessions (PostgreSQL writes the commit record first). That candidate
///   and the aggregate's later ones are carried to the next claim.
///
/// Candidates published already (a replay) or deleted are skipped. Claimed events after a stop
/// stay in `claimed` (the commit puts them back).
pub(super) fn group_candidates(
    candidates: &[Candidate],
    claimed: &mut HashMap<Uuid, OutboxEvent>,
    states: &HashMap<Uuid, RowState>,
) -> Grouping {
    let mut out = Grouping::default();
    let mut group_of: HashMap<&AggregateKey, usize> = HashMap::new();
    let mut stopped: HashSet<&AggregateKey> = HashSet::new();
    let mut carried: HashSet<&AggregateKey> = HashSet::new();
    for c in candidates {
        if carried.contains(&c.aggregate) {
            out.carry.push(c.clone());
            continue;
        }
        if stopped.contains(&c.aggregate) {
            continue;
        }
        match claimed.remove(&c.id) {
            Some(event) => match group_of.get(&c.aggregate) {
                Some(&g) => out.groups[g].push(event),
                None => {
                    group_of.insert(&c.aggregate, out.groups.len());
                    out.groups.push(vec![event]);
                }
            },
            None => match states.get(&c.id) {
                Some(RowState::Pending) => {
                    stopped.insert(&c.aggregate);
                    out.defer.push(c.aggregate.clone());
                }
                Some(RowState::Moved(to)) => {
                    stopped.insert(&c.aggregate);
                    out.defer.push(c.aggregate.clone());
                    out.defer.push(to.clone());
                }
                Some(RowState::Done) => {}
                Some(RowState::NotVisible) | None => {
                    carried.insert(&c.aggregate);
                    out.carry.push(c.clone());
                }
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(aggregate: &str) -> Candidate {
        Candidate {
            transaction: None,
            id: Uuid::new_v4(),
            aggregate: ("order".into(), aggregate.into()),
            xid: 0,
            size: 0,
            content: None,
        }
    }

    fn event(c: &Candidate) -> OutboxEvent {
        OutboxEvent {
            id: c.id,
            ..OutboxEvent::sample(&c.aggregate.1)
        }
    }

    #[test]
    fn candidates_group_in_their_order_and_stop_where_they_cannot_go_on() {
        // a1 a2(held elsewhere) a3 | b1 b2 | c1(published already) c2 | d1(not visible yet) d2
        let c = [
            candidate("a"),
            candidate("b"),
            candidate("a"),
            candidate("c"),
            candidate("b"),
            candidate("a"),
            candidate("c"),
            candidate("d"),
            candidate("d"),
        ];
        let not_claimed = [c[2].id, c[3].id, c[7].id];
        let mut claimed: HashMap<Uuid, OutboxEvent> = c
            .iter()
            .filter(|x| !not_claimed.contains(&x.id))
            .map(|x| (x.id, event(x)))
            .collect();
        let states: HashMap<Uuid, RowState> = [
            (c[2].id, RowState::Pending),
            (c[3].id, RowState::Done),
            (c[7].id, RowState::NotVisible),
        ]
        .into_iter()
        .collect();
        let g = group_candidates(&c, &mut claimed, &states);
        let ids: Vec<Vec<Uuid>> = g
            .groups
            .iter()
            .map(|g| g.iter().map(|e| e.id).collect())
            .collect();
        assert_eq!(ids, [vec![c[0].id], vec![c[1].id, c[4].id], vec![c[6].id]]);
        assert_eq!(g.defer, [("order".to_string(), "a".to_string())]);
        assert_eq!(g.carry, [c[7].clone(), c[8].clone()]);
        // a3 and d2 were claimed but come after a stop: left for the commit to put back.
        let mut left: Vec<Uuid> = claimed.keys().copied().collect();
        left.sort();
        let mut expected = vec![c[5].id, c[8].id];
        expected.sort();
        assert_eq!(left, expected);
    }
}
