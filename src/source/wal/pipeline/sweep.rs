//! The sweep's rounds over the deferred aggregates, as the durable record says.

use foldhash::{HashSet, HashSetExt};

use super::{Pipeline, Round};
use crate::event::AggregateKey;

impl Pipeline {
    /// Where the next sweep round starts: after the last aggregate served (the rounds go round
    /// the durable record, `outbox_wal_deferred`, in key order).
    pub fn cursor(&self) -> AggregateKey {
        self.cursor.clone().unwrap_or_default()
    }

    /// A sweep serves `aggregates`, read from the durable record, which decides: they are deferred
    /// whoever recorded them (this relay, another, a script), and memory, only a
    /// cache of that record, learns them. Those of which a streamed row is not resolved yet are
    /// frozen.
    pub fn serve(&mut self, aggregates: Vec<AggregateKey>) -> Round {
        if let Some(last) = aggregates.last() {
            self.cursor = Some(last.clone());
        }
        self.deferred.extend(aggregates.iter().cloned());
        let frozen = match aggregates.is_empty() {
            true => HashSet::new(),
            false => {
                let pending: HashSet<&AggregateKey> =
                    self.rows.values().map(|t| &t.row.aggregate).collect();
                aggregates
                    .iter()
                    .filter(|k| pending.contains(k))
                    .cloned()
                    .collect()
            }
        };
        Round { aggregates, frozen }
    }

    /// A sweep's transaction undeferred these aggregates (the table has no pending row of them).
    pub fn undefer(&mut self, aggregates: &[AggregateKey]) {
        for key in aggregates {
            self.deferred.remove(key);
        }
    }
}
