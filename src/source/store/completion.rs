//! `--transactions atomic`: the rest of each transaction a claim holds part of, taken into the
//! claim so that it goes out whole ([`Claim::complete_transactions`], `complete_transactions.sql`),
//! placed in its aggregates' groups by seq or by the source's commit order ([`CommitOrder`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::TryStreamExt;
use uuid::Uuid;

use super::claim::Claim;
use super::row::{claimed_row, ClaimedRow};
use crate::error::Result;
use crate::event::AggregateKey;

/// What [`Claim::complete_transactions`] found: rows taken that must wait behind an older row of
/// their aggregate outside the batch, transactions that could not all be taken, and those too
/// large for one atomic batch.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    pub blocked: HashSet<Uuid>,
    pub incomplete: HashSet<u64>,
    pub split: HashSet<u64>,
}

/// What a source knows of commit order beyond the claim's snapshot, asked about the rows an atomic
/// completion takes from the table. The wal source's stream brings a commit before it is visible
/// (behind a synchronous standby, a round trip): the completion's check for an older pending row
/// of the aggregate cannot see it, the stream's order can.
pub(crate) trait CommitOrder: Sync {
    /// Of the rows `taken` (id, aggregate as the table holds it), with `claimed` (the claim's
    /// rows): where the rows the source knows stand, and which taken rows must wait.
    fn taken(&self, claimed: &HashSet<Uuid>, taken: &[(Uuid, &AggregateKey)]) -> TakenOrder;
}

/// What [`CommitOrder::taken`] says.
#[derive(Debug, Default)]
pub(crate) struct TakenOrder {
    /// The places in the source's order of the taken rows it knows and of the claim's rows of
    /// their aggregates: a taken row joins its group by it (by seq where any is missing).
    pub position: HashMap<Uuid, u64>,
    /// Taken rows that an earlier commit of their aggregate, neither in the claim nor taken, and
    /// not published, must precede (or whose place the source cannot tell yet).
    pub wait: HashSet<Uuid>,
}

impl Claim<'_> {
    /// `--transactions atomic`: takes the pending rest of each transaction the claim holds events
    /// of (up to `limit` events; `ordered`: the claim keeps per-aggregate order), so that it goes
    /// out whole (`complete_transactions.sql`). The rows taken join their aggregates' groups (or
    /// new ones) in seq order, or in `order`'s where it knows them, and are put back at the finish
    /// unless published or failed; a row `order` says must wait is blocked.
    pub async fn complete_transactions(
        &mut self,
        limit: usize,
        max_bytes: usize,
        ordered: bool,
        order: Option<&dyn CommitOrder>,
    ) -> Result<Completion> {
        let mut completion = Completion::default();
        let statement = &self.statements.complete_transactions;
        // Per transaction: events and bytes the claim holds (bytes as the payload and headers
        // the relay read, near enough to `outbox_row_size()`).
        let mut here: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
        let mut ids: Vec<Uuid> = Vec::new();
        for e in self.groups.iter().flatten() {
            if let Some(t) = e.transaction.filter(|t| t.events != Some(1)) {
                let entry = here.entry(t.id).or_default();
                let headers: usize = e.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
                entry.0 += 1;
                entry.1 = entry
                    .1
                    .saturating_add(i64::try_from(e.payload.len() + headers).unwrap_or(i64::MAX));
                ids.push(e.id);
            }
        }
        if here.is_empty() {
            return Ok(completion);
        }
        let txids: Vec<String> = here.keys().map(u64::to_string).collect();
        let (counts, bytes): (Vec<i64>, Vec<i64>) = here.into_values().unzip();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        let stream = statement
            .query_raw(
                self.client,
                &[&txids, &counts, &ids, &limit, &ordered, &bytes, &max_bytes],
            )
            .await?;
        futures::pin_mut!(stream);
        let mut taken: Vec<(ClaimedRow, bool)> = Vec::new();
        while let Some(row) = stream.try_next().await? {
            let kind: &str = row.try_get("kind")?;
            let txid = || {
                row.try_get::<_, Option<&str>>("txid")
                    .ok()
                    .flatten()
                    .and_then(|t| t.parse::<u64>().ok())
            };
            match kind {
                "split" => completion.split.extend(txid()),
                "incomplete" => completion.incomplete.extend(txid()),
                _ => taken.push((claimed_row(&row)?, row.try_get("blocked")?)),
            }
        }
        // The source's order, where it knows more than the claim's snapshot (rows taken only).
        let taken_order = match order.filter(|_| ordered && !taken.is_empty()) {
            Some(order) => {
                let claimed: HashSet<Uuid> = self.groups.iter().flatten().map(|e| e.id).collect();
                let rows: Vec<(Uuid, &AggregateKey)> = taken
                    .iter()
                    .filter_map(|(row, _)| row.event.as_ref().map(|e| (e.id, &row.aggregate)))
                    .collect();
                order.taken(&claimed, &rows)
            }
            None => TakenOrder::default(),
        };
        let mut at: HashMap<(String, String), usize> = HashMap::new();
        for (g, group) in self.groups.iter().enumerate() {
            if let Some(e) = group.first() {
                at.insert((e.aggregate_type.clone(), e.aggregate_id.clone()), g);
            }
        }
        for (row, blocked) in taken {
            let aggregate = row.aggregate.clone();
            let Some(event) = row.into_event() else {
                continue;
            };
            self.marked.push(event.id);
            self.claimed += 1;
            if blocked || taken_order.wait.contains(&event.id) {
                completion.blocked.insert(event.id);
            }
            match at.get(&aggregate).filter(|_| ordered) {
                Some(&g) => {
                    let group = &mut self.groups[g];
                    let position = &taken_order.position;
                    let place = match position.get(&event.id) {
                        Some(p) if group.iter().all(|e| position.contains_key(&e.id)) => {
                            group.partition_point(|e| position.get(&e.id).is_some_and(|q| q < p))
                        }
                        _ => group.partition_point(|e| e.seq < event.seq),
                    };
                    group.insert(place, event);
                }
                None => {
                    if ordered {
                        at.insert(aggregate, self.groups.len());
                    }
                    self.groups.push(vec![event]);
                }
            }
        }
        Ok(completion)
    }
}
