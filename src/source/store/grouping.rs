//! A claim's rows in groups to publish ([`group_claim`]): one aggregate's rows in seq order up to
//! its first row not to publish now, and what the rows say of the next claim (full, its limit,
//! whether to hop between aggregates). Pure, unit-tested.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use uuid::Uuid;

use super::row::ClaimedRow;
use crate::config::Ordering;
use crate::event::OutboxEvent;

/// What a claim's rows mean for publishing and for the next claim.
#[derive(Debug)]
pub(super) struct Grouped {
    pub(super) groups: Vec<Vec<OutboxEvent>>,
    /// Rows locked, publishable or not.
    pub(super) claimed: usize,
    /// More rows are probably waiting: claim again at once.
    pub(super) full: bool,
    /// Rows marked processed by the claim (the events of `groups`).
    pub(super) marked: Vec<Uuid>,
    /// Rows to claim at most next time: after a claim cut by the byte budget about twice what fit
    /// then (every candidate's size is measured, big payloads as text, so candidates far past the
    /// budget cost time); growing back while claims fit.
    pub(super) next_limit: usize,
    /// A full batch with fewer heads than it could take: a deep backlog in few aggregates, where
    /// walking the seq index for heads visits every pending row. Hopping between aggregates is
    /// cheaper there, until either changes.
    pub(super) sparse: bool,
}

/// Groups the rows of a claim of at most `limit` rows (see [`group_by_aggregate`]).
pub(super) fn group_claim(mut rows: Vec<ClaimedRow>, ordering: Ordering, limit: usize) -> Grouped {
    rows.sort_by_key(|r| r.seq);
    let claimed = rows.len();
    let held = rows.iter().any(|r| r.held);
    let marked: Vec<Uuid> = rows
        .iter()
        .filter_map(|r| r.event.as_ref().map(|e| e.id))
        .collect();
    let next_limit = if held {
        marked.len().saturating_mul(2).max(1)
    } else {
        limit.saturating_mul(2)
    };
    match ordering {
        Ordering::None => Grouped {
            groups: rows
                .into_iter()
                .filter_map(|r| r.event.map(|e| vec![e]))
                .collect(),
            claimed,
            full: claimed >= limit || held,
            marked,
            next_limit,
            sparse: false,
        },
        Ordering::Aggregate => {
            let (groups, heads, deepest) = group_by_aggregate(rows);
            // The statement gives each aggregate at most this many followers (its share of the
            // room left after the heads); one that got them all probably has more.
            let share = limit.saturating_sub(1) / heads.max(1);
            let full = claimed >= limit || (share > 0 && deepest > share) || held;
            Grouped {
                groups,
                claimed,
                full,
                marked,
                next_limit,
                sparse: full && heads < limit,
            }
        }
    }
}

/// Claimed rows (in seq order) grouped by aggregate: each aggregate's rows from its head up to its
/// first row that is not to be published now (publishing past it would break the order). Returns
/// the groups, the number of aggregates claimed and the most rows claimed for one aggregate.
fn group_by_aggregate(rows: Vec<ClaimedRow>) -> (Vec<Vec<OutboxEvent>>, usize, usize) {
    struct Aggregate {
        /// The group still taking rows; `None` once the aggregate stopped.
        group: Option<usize>,
        rows: usize,
    }
    let mut index: HashMap<(String, String), Aggregate> = HashMap::new();
    let mut groups: Vec<Vec<OutboxEvent>> = Vec::new();
    for row in rows {
        match index.entry(row.aggregate) {
            Entry::Vacant(slot) => {
                let group = row.event.map(|e| {
                    groups.push(vec![e]);
                    groups.len() - 1
                });
                slot.insert(Aggregate { group, rows: 1 });
            }
            Entry::Occupied(mut slot) => {
                let aggregate = slot.get_mut();
                aggregate.rows += 1;
                match (aggregate.group, row.event) {
                    (Some(g), Some(event)) => groups[g].push(event),
                    _ => aggregate.group = None,
                }
            }
        }
    }
    let deepest = index.values().map(|a| a.rows).max().unwrap_or(0);
    (groups, index.len(), deepest)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;

    use super::*;
    use crate::timestamp::Timestamp;

    /// A claimed row of aggregate `a` at `seq`: published now (`Some`), or not (`None`: waiting
    /// for its retry, dead, or held back).
    fn row(a: &str, seq: i64, publish: bool) -> ClaimedRow {
        ClaimedRow {
            seq,
            aggregate: ("order".into(), a.into()),
            event: publish.then(|| OutboxEvent {
                id: Uuid::new_v4(),
                seq,
                aggregate_type: "order".into(),
                aggregate_id: a.into(),
                event_type: "created".into(),
                payload: Bytes::from_static(b"{}"),
                headers: BTreeMap::new(),
                attempts: 0,
                created_at: Timestamp::now(),
                defect: None,
                transaction: None,
            }),
            held: false,
            tid: None,
            prev: None,
        }
    }

    fn held(a: &str, seq: i64) -> ClaimedRow {
        ClaimedRow {
            held: true,
            ..row(a, seq, false)
        }
    }

    /// Each group as (aggregate, seqs).
    fn shape(groups: &[Vec<OutboxEvent>]) -> Vec<(String, Vec<i64>)> {
        groups
            .iter()
            .map(|g| (g[0].aggregate_id.clone(), g.iter().map(|e| e.seq).collect()))
            .collect()
    }

    #[test]
    fn groups_follow_seq_order_per_aggregate_and_stop_at_the_first_gap() {
        // Out of order as the statement may return them; b's head waits for a retry, c stops
        // before its unpublishable row.
        let rows = vec![
            row("a", 5, true),
            row("a", 1, true),
            row("b", 2, false),
            row("b", 3, true),
            row("c", 4, true),
            row("c", 6, false),
            row("c", 7, true),
        ];
        let g = group_claim(rows, Ordering::Aggregate, 100);
        assert_eq!(
            shape(&g.groups),
            [("a".to_string(), vec![1, 5]), ("c".to_string(), vec![4])]
        );
        assert_eq!(g.claimed, 7);
        // Every row the claim marked: b's and c's beyond their gap are put back by `finish`.
        assert_eq!(g.marked.len(), 5);
        assert!(!g.full);
        assert!(!g.sparse);
        assert_eq!(g.next_limit, 200);
    }

    #[test]
    fn a_claim_is_full_at_the_limit_or_when_an_aggregate_took_its_whole_share() {
        let at_limit: Vec<_> = (0..4).map(|i| row(&format!("x{i}"), i, true)).collect();
        assert!(group_claim(at_limit, Ordering::Aggregate, 4).full);
        // Two heads, limit 5: each aggregate may take (5 - 1) / 2 = 2 followers; `a` took 3 rows.
        let deep = vec![
            row("a", 1, true),
            row("b", 2, true),
            row("a", 3, true),
            row("a", 4, true),
        ];
        let g = group_claim(deep, Ordering::Aggregate, 5);
        assert!(g.full);
        assert!(
            g.sparse,
            "full with fewer heads than the limit: hop between aggregates"
        );
        let shallow = vec![row("a", 1, true), row("b", 2, true), row("a", 3, true)];
        assert!(!group_claim(shallow, Ordering::Aggregate, 5).full);
    }

    #[test]
    fn the_byte_budget_marks_the_claim_full_and_shrinks_the_next() {
        let rows = vec![row("a", 1, true), row("b", 2, true), held("c", 3)];
        let g = group_claim(rows, Ordering::Aggregate, 1000);
        assert!(g.full);
        assert_eq!(g.next_limit, 4, "twice what fit");
        assert_eq!(g.groups.len(), 2);
        let alone = group_claim(vec![held("big", 1)], Ordering::Aggregate, 1000);
        assert_eq!(alone.next_limit, 1);
    }

    #[test]
    fn without_ordering_every_published_row_is_a_group_of_its_own() {
        let rows = vec![row("a", 2, true), row("a", 1, true), row("b", 3, false)];
        let g = group_claim(rows, Ordering::None, 3);
        assert_eq!(
            shape(&g.groups),
            [("a".to_string(), vec![1]), ("a".to_string(), vec![2])]
        );
        assert!(g.full, "claimed as many as the limit");
        assert!(!g.sparse);
        let g = group_claim(vec![row("a", 1, true)], Ordering::None, 3);
        assert!(!g.full);
    }
}
