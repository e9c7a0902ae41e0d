//! A sweep's claim: the pending rows of aggregates handed to the table (`outbox_wal_deferred`),
//! a slice of a batch shared among those that may go now, and what the sweep found besides
//! ([`SweepInfo`]).

use foldhash::{HashMap, HashMapExt, HashSet};
use std::time::Duration;

use uuid::Uuid;

use super::claim::claim_in;
use super::states::group_candidates;
use super::{WalRecord, WalStore};
use crate::error::Result;
use crate::event::AggregateKey;
use crate::source::store::Claim;
use crate::source::wal::pipeline::{Candidate, Round};

/// What a sweep of aggregates handed to the table found besides its claim.
#[derive(Debug, Default)]
pub(crate) struct SweepInfo {
    /// Aggregates whose every pending row is in the claim (their events go back to the stream
    /// once these are published).
    pub complete: Vec<AggregateKey>,
    /// Aggregates without a pending row: taken back in this batch's transaction.
    pub cleared: Vec<AggregateKey>,
    /// The earliest retry due among the rows that are waiting for one.
    pub next_due: Option<Duration>,
    /// Aggregates whose claim stopped at a row it could not take (held elsewhere).
    pub held: HashSet<AggregateKey>,
    /// The aggregates this sweep served (read from `outbox_wal_deferred`).
    pub served: Vec<AggregateKey>,
}

impl WalStore {
    /// Opens a transaction and claims, for aggregates handed to the table, their pending rows in
    /// seq order up to the first one that may not be published now, a sweep's slice of a batch
    /// in rows and bytes (a single larger row still goes alone), shared evenly among the
    /// aggregates whose oldest pending row may go now (not among those stuck behind a dead letter
    /// or a retry: a hot aggregate among a hundred blocked ones gets the whole batch). Aggregates
    /// with no pending row left are taken back in the same transaction.
    pub async fn sweep(
        &mut self,
        after: &AggregateKey,
        n: usize,
        serve: impl FnOnce(Vec<AggregateKey>) -> Round,
        batch: &crate::config::BatchConfig,
    ) -> Result<(Claim<'_>, WalRecord<'_>, SweepInfo)> {
        let (max_rows, max_bytes) = batch.sweep_slice();
        let (mut claim, wal) = self.store.begin().await?;
        let client = claim.client();
        // What to serve: the durable record decides, in this transaction.
        let limit = i64::try_from(n).unwrap_or(i64::MAX);
        let chosen = wal
            .sweep_round
            .query(client, &[&after.0, &after.1, &limit])
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<AggregateKey>>>()?;
        let round = serve(chosen);
        let (aggregates, frozen) = (&round.aggregates[..], &round.frozen);
        let keys = |aggregates: &[&AggregateKey]| -> (Vec<String>, Vec<String>) {
            aggregates
                .iter()
                .map(|(t, i)| (t.clone(), i.clone()))
                .unzip()
        };
        // First each aggregate's oldest pending row: which may go now.
        let all: Vec<&AggregateKey> = aggregates.iter().collect();
        let (types, ids) = keys(&all);
        let heads = wal.pending_of.query(client, &[&types, &ids, &1i64]).await?;
        let mut info = SweepInfo::default();
        let mut rows = Vec::with_capacity(heads.len());
        let mut going: Vec<&AggregateKey> = Vec::new();
        for row in heads {
            let key: AggregateKey = (row.try_get(1)?, row.try_get(2)?);
            let go = row.try_get::<_, bool>("eligible")? && !frozen.contains(&key);
            match go.then(|| aggregates.iter().find(|k| **k == key)).flatten() {
                Some(k) => going.push(k),
                None => rows.push(row),
            }
        }
        // Then those that may go, an even share of the batch each (one more than taken: an
        // aggregate that shows no more is complete).
        let per_aggregate = batch.per_aggregate(going.len());
        if !going.is_empty() {
            let limit = i64::try_from(per_aggregate.saturating_add(1)).unwrap_or(i64::MAX);
            let (types, ids) = keys(&going);
            rows.extend(
                wal.pending_of
                    .query(client, &[&types, &ids, &limit])
                    .await?,
            );
        }
        let mut pending: HashMap<AggregateKey, Vec<PendingRow>> = HashMap::new();
        for row in &rows {
            let key: AggregateKey = (row.try_get(1)?, row.try_get(2)?);
            let due: Option<f64> = row.try_get("due_in_seconds")?;
            let eligible: bool = row.try_get("eligible")?;
            let dead: bool = row.try_get("dead")?;
            if !eligible && !dead {
                let due = Duration::from_secs_f64(due.unwrap_or(0.0).clamp(0.0, 1e9));
                info.next_due = Some(info.next_due.map_or(due, |d: Duration| d.min(due)));
            }
            pending.entry(key).or_default().push(PendingRow {
                id: row.try_get("id")?,
                eligible,
                size: usize::try_from(row.try_get::<_, Option<i32>>("size")?.unwrap_or(0))
                    .unwrap_or(0),
            });
        }
        let mut candidates = Vec::new();
        let mut bytes = 0usize;
        for key in aggregates {
            let Some(rows) = pending.remove(key) else {
                info.cleared.push(key.clone());
                continue;
            };
            let mut taken = 0;
            // Frozen: the stream holds a row of it that may come first; only taken back when the
            // table has none.
            let share = if frozen.contains(key) {
                0
            } else {
                per_aggregate
            };
            for row in rows.iter().take(share) {
                let over = candidates.len() >= max_rows
                    || (!candidates.is_empty() && bytes.saturating_add(row.size) > max_bytes);
                if !row.eligible || over {
                    break;
                }
                bytes = bytes.saturating_add(row.size);
                candidates.push(Candidate {
                    transaction: None,
                    id: row.id,
                    aggregate: key.clone(),
                    xid: 0,
                    size: row.size,
                    content: None,
                });
                taken += 1;
            }
            if taken == rows.len() {
                info.complete.push(key.clone());
            }
        }
        let (mut taken, states, marked) = claim_in(client, wal, &mut candidates).await?;
        let grouping = group_candidates(&candidates, &mut taken.claimed, &states);
        // Read from the table in this transaction, every one is visible: none is carried.
        info.held.extend(grouping.defer.iter().cloned());
        info.held
            .extend(grouping.carry.iter().map(|c| c.aggregate.clone()));
        claim.fill(grouping.groups, marked.len(), marked);
        claim.full = candidates.len() >= max_rows;
        let record = WalRecord {
            statements: wal,
            tids: taken.tids,
            defer: grouping.defer,
            undefer: info.cleared.clone(),
        };
        info.served = round.aggregates;
        Ok((claim, record, info))
    }
}

struct PendingRow {
    id: Uuid,
    eligible: bool,
    size: usize,
}
