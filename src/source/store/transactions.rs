//! Where each event stands in its transaction (the transaction headers): placed by one statement
//! in the claim's transaction (`transactions.sql`, [`Claim::read_transactions`]), helped by what
//! earlier batches learnt ([`Learnt`]); and the transactions a batch publishes only part of
//! ([`Split`], [`Runs`]), which the wal source keeps in the table until they are whole.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::TryStreamExt;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::claim::Claim;
use crate::error::Result;

/// The events a batch published whose transaction it did not publish whole (its other events
/// went in other batches, or are not published yet), and those transactions (their `txid`s). The
/// wal source, which deletes what it publishes, keeps these rows in the table (marked) until the
/// whole transaction is published: a transaction's count is read from the table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Split {
    /// The published events to keep (marked): those of split transactions that are not runs.
    pub ids: Vec<Uuid>,
    /// Every split transaction.
    pub txids: Vec<u64>,
    /// The split transactions of consecutive seqs: (txid, first seq, count), kept instead of
    /// their rows.
    pub runs: Vec<(u64, i64, u64)>,
}

/// The transactions of a batch whose rows are consecutive seqs: txid -> (first seq, count).
pub(crate) type Runs = HashMap<u64, (i64, u64)>;

/// What the relay learnt of transactions a batch published part of, so that the next batch of
/// one asks less of the table: values a restart loses and the table gives again (it holds a
/// transaction's rows until all are published); at most [`LEARNT_MAX`] transactions.
#[derive(Default)]
pub(crate) struct Learnt(HashMap<u64, Known>);

#[derive(Debug, Clone, Copy)]
enum Known {
    /// Its rows are consecutive seqs from `first`: an event's place is its seq's distance from
    /// it; nothing to ask.
    Run { first: i64, events: u64 },
    /// The place of one of its rows (`seq`), which the next batch counts from.
    At { seq: i64, index: u64, events: u64 },
}

/// Transactions remembered at most by [`Learnt`] (forgotten all at once past it).
const LEARNT_MAX: usize = 4096;

impl Claim<'_> {
    /// Places each event to publish in its transaction where its source did not (the wal stream
    /// places the rows it carried, with the count when the commit came within its hold): one
    /// statement in the claim's transaction (`transactions.sql`). Returns the transactions found to
    /// be runs of consecutive seqs.
    pub async fn read_transactions(&mut self) -> Result<Runs> {
        let (statement, learnt) = &self.statements.transactions;
        // Per transaction: lowest and highest seq in the batch, events in the batch. Asked for:
        // the transactions with an event not placed, and those placed (by the wal stream) that
        // the batch holds only part of, whose rows the wal source must know to be a run or not.
        let mut spans: BTreeMap<u64, (i64, i64, i64)> = BTreeMap::new();
        let mut unplaced: HashSet<u64> = HashSet::new();
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for e in self.groups.iter().flatten() {
            if let Some(t) = e.transaction {
                let span = spans.entry(t.id).or_insert((e.seq, e.seq, 0));
                span.0 = span.0.min(e.seq);
                span.1 = span.1.max(e.seq);
                span.2 += 1;
                match t.events.filter(|_| t.is_placed()) {
                    Some(events) => {
                        counts.insert(t.id, events);
                    }
                    None => {
                        unplaced.insert(t.id);
                    }
                }
            }
        }
        spans.retain(|txid, (_, _, n)| {
            unplaced.contains(txid)
                || counts
                    .get(txid)
                    .is_some_and(|events| u64::try_from(*n).unwrap_or(0) != *events)
        });
        if spans.is_empty() {
            return Ok(Runs::new());
        }
        let known: HashMap<u64, Known> = {
            let learnt = learnt.lock().unwrap_or_else(|e| e.into_inner());
            spans
                .keys()
                .filter_map(|txid| learnt.0.get(txid).map(|k| (*txid, *k)))
                .collect()
        };
        // Placed by seq: (place, count); or by transaction: numbered in the batch (`Whole`) or
        // by seq from the first (`Run`).
        let mut placed: HashMap<i64, (u64, u64)> = HashMap::new();
        let mut whole: HashMap<u64, u64> = HashMap::new();
        let mut runs = Runs::new();
        for (txid, k) in &known {
            if let Known::Run { first, events } = k {
                runs.insert(*txid, (*first, *events));
            }
        }
        let ask: Vec<(&u64, &(i64, i64, i64))> = spans
            .iter()
            .filter(|(txid, _)| !runs.contains_key(txid))
            .collect();
        if !ask.is_empty() {
            let mut params: (Vec<String>, Vec<i64>, Vec<i64>, Vec<i64>) = Default::default();
            // What an earlier batch learnt: a seq, its place, the count.
            let mut at: [Vec<Option<i64>>; 3] = Default::default();
            for (txid, (lo, hi, n)) in &ask {
                params.0.push(txid.to_string());
                params.1.push(*lo);
                params.2.push(*hi);
                params.3.push(*n);
                let (seq, index, events) = match known.get(txid) {
                    Some(Known::At { seq, index, events }) => (
                        Some(*seq),
                        i64::try_from(*index).ok(),
                        i64::try_from(*events).ok(),
                    ),
                    _ => (None, None, None),
                };
                at[0].push(seq);
                at[1].push(index);
                at[2].push(events);
            }
            let args: [&(dyn ToSql + Sync); 7] = [
                &params.0, &params.1, &params.2, &params.3, &at[0], &at[1], &at[2],
            ];
            let stream = statement.query_raw(self.client, &args).await?;
            futures::pin_mut!(stream);
            let number = |v: i64| u64::try_from(v).unwrap_or(0);
            while let Some(row) = stream.try_next().await? {
                let Ok(txid) = row.try_get::<_, &str>("txid")?.parse::<u64>() else {
                    continue;
                };
                let events = number(row.try_get::<_, i64>("events")?);
                match row.try_get::<_, &str>("kind")? {
                    "whole" => {
                        whole.insert(txid, events);
                    }
                    "run" => {
                        if let Some(first) = row.try_get::<_, Option<i64>>("first")? {
                            runs.insert(txid, (first, events));
                        }
                    }
                    _ => {
                        if let (Some(seq), Some(position)) = (
                            row.try_get::<_, Option<i64>>("seq")?,
                            row.try_get::<_, Option<i64>>("position")?,
                        ) {
                            placed.insert(seq, (number(position), events));
                        }
                    }
                }
            }
        }
        // Whole transactions are numbered in the batch, in seq order.
        let mut ranks: HashMap<u64, Vec<i64>> = HashMap::new();
        for e in self.groups.iter().flatten() {
            if let Some(t) = e
                .transaction
                .filter(|t| !t.is_placed() && whole.contains_key(&t.id))
            {
                ranks.entry(t.id).or_default().push(e.seq);
            }
        }
        for seqs in ranks.values_mut() {
            seqs.sort_unstable();
        }
        for event in self.groups.iter_mut().flatten() {
            let seq = event.seq;
            let Some(t) = event.transaction.as_mut().filter(|t| !t.is_placed()) else {
                continue;
            };
            let found = if let Some(&(first, events)) = runs.get(&t.id) {
                u64::try_from(seq - first + 1)
                    .ok()
                    .map(|index| (index, events))
            } else if let Some(&(index, events)) = placed.get(&seq) {
                Some((index, events))
            } else if let (Some(&events), Some(seqs)) = (whole.get(&t.id), ranks.get(&t.id)) {
                seqs.binary_search(&seq)
                    .ok()
                    .map(|at| (at as u64 + 1, events))
            } else {
                None
            };
            if let Some((index, events)) =
                found.filter(|(index, events)| *index >= 1 && index <= events)
            {
                t.index = index;
                t.events = Some(events);
            }
        }
        // What the next batch of a transaction published in part starts from.
        let mut learnt = learnt.lock().unwrap_or_else(|e| e.into_inner());
        if learnt.0.len() > LEARNT_MAX {
            learnt.0.clear();
        }
        for (txid, (_, hi, _)) in &spans {
            if let Some(&(first, events)) = runs.get(txid) {
                learnt.0.insert(*txid, Known::Run { first, events });
            } else if let Some(&(index, events)) = placed.get(hi) {
                learnt.0.insert(
                    *txid,
                    Known::At {
                        seq: *hi,
                        index,
                        events,
                    },
                );
            }
        }
        Ok(runs)
    }
}
