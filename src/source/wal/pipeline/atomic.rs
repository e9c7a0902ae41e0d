//! `--transactions atomic`: the order the rows an atomic completion takes from the table keep.

use foldhash::{HashMap, HashMapExt, HashSet};
use uuid::Uuid;

use super::{Fate, Pipeline, Tracked};
use crate::event::AggregateKey;
use crate::source::store::{CommitOrder, TakenOrder};

impl Pipeline {
    /// The row at stream `index` has had its fate decided by its batch: published, gone, or with
    /// the table (its aggregate deferred, the row visible there).
    fn decided(&self, index: u64, t: &Tracked) -> bool {
        t.batch
            .and_then(|b| self.flights.iter().find(|f| f.id == b))
            .and_then(|f| f.fate_of(index))
            .is_some_and(|f| matches!(f, Fate::Published | Fate::Done | Fate::Deferred))
    }

    /// `key` is deferred, or a batch in flight defers it.
    fn with_table(&self, key: &AggregateKey) -> bool {
        (!self.deferred.is_empty() && self.deferred.contains(key))
            || self
                .flights
                .iter()
                .any(|f| !f.deferring.is_empty() && f.deferring.contains(key))
    }
}

/// `--transactions atomic`: the rows a completion takes from the table (the rest of a transaction
/// the claim holds part of) keep the stream's order. A taken row the stream brought waits while an
/// earlier-streamed row of its aggregate is neither in the claim nor taken and not decided
/// (published, gone, with the table): streamed before it, it committed before it, and may not be
/// visible yet, which the completion's own check cannot see. A taken row the stream has not
/// brought (a restart streams again from the slot's position, the sweep may run first) waits
/// unless its aggregate is deferred, whose order is the table's; then only while a streamed
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
