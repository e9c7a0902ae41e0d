//! What the pipeline takes and gives: the rows the stream brings, what a claim found of them,
//! the rows of a batch, a sweep's round.

use std::sync::Arc;

use foldhash::HashSet;
use uuid::Uuid;

use crate::event::{AggregateKey, OutboxEvent, TransactionPosition};

/// A streamed row to claim by id, with its aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub id: Uuid,
    pub aggregate: AggregateKey,
    /// The (32-bit) id of the transaction that wrote the row, from the stream; 0 for rows read
    /// from the table.
    pub xid: u32,
    /// The row's bytes as streamed (or measured in the table): what it weighs in a batch.
    pub size: usize,
    /// The row as its INSERT wrote it, when the stream carried all of it and nothing in its
    /// transaction changed it: published as it is if the claim finds the row unchanged since.
    pub content: Option<Streamed>,
    /// Where the row stands in its transaction, as the stream told (its `txid`, its place among
    /// the transaction's inserts, their count when the commit came within the stream's hold).
    /// `None` for rows read from the table, or without a `txid`.
    pub transaction: Option<TransactionPosition>,
}

/// A streamed row's content, shared (not copied) while the row moves through the pipeline.
#[derive(Debug, Clone)]
pub(crate) struct Streamed(pub Arc<OutboxEvent>);

/// The same content (the pipeline compares rows, never their bytes).
impl PartialEq for Streamed {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Streamed {}

/// One fact from the replication stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// A transaction begins.
    Begin,
    /// A committed insert into the outbox (its transaction's commit follows).
    Insert(Candidate),
    /// The transaction of the inserts before this one committed; `end`: the position after it.
    Commit { end: u64 },
    /// The server has sent everything up to `wal_end` (a keepalive).
    Idle { wal_end: u64 },
}

/// What a claim by id found of one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Claimed (locked): visible and publishable now.
    Claimed,
    /// Its transaction is not visible yet: claim it again shortly.
    NotVisible,
    /// Published already (a replay), or deleted.
    Done,
    /// Pending but not claimed: locked elsewhere, waiting for a retry, dead-lettered.
    /// Its aggregate goes to the table.
    Pending,
}

/// A batch's number (increasing: batches are published and recorded in this order).
pub(crate) type BatchId = u64;

/// Rows to claim as one batch.
#[derive(Debug)]
pub(crate) struct Cut {
    pub batch: BatchId,
    pub rows: Vec<Candidate>,
}

/// A sweep of deferred aggregates.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Round {
    pub aggregates: Vec<AggregateKey>,
    /// Of those, aggregates with a streamed row not resolved yet: none of their rows may be
    /// published by the sweep (that row may be older and not visible), but they may be undeferred
    /// when the table holds no pending row of them.
    pub frozen: HashSet<AggregateKey>,
}
