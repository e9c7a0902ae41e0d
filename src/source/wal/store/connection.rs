//! [`WalStore`]: a worker connection of the wal source, the table source's [`Store`] with the
//! wal statements prepared on the same connection when it is opened; the table's claim recorded
//! as the wal source records its batches.

use foldhash::{HashMap, HashMapExt};

use super::{WalRecord, WalStatements};
use crate::config::WalMarking;
use crate::error::Result;
use crate::source::store::{Claim, Store};

/// A worker connection of the wal source: the table source's [`Store`] with the wal source's
/// statements prepared on each of its connections (dropped with it).
pub(crate) struct WalStore {
    pub(super) store: Store<WalStatements>,
    pub(super) marking: WalMarking,
    /// The schema marks rows changed after their insert (version 6).
    pub(super) rewrites_marked: bool,
}

impl WalStore {
    pub fn new(store: Store, marking: WalMarking) -> WalStore {
        WalStore {
            store: store.with(marking),
            marking,
            rewrites_marked: false,
        }
    }

    /// Whether a claim publishes a streamed row from the content the stream carried (when the
    /// row is unchanged since): with `--wal-marking delete`, whose claim only locks (marking
    /// writes the row in the claim, before it could tell), and a schema that marks rows changed
    /// after their insert (`rewrites_marked`, version 6).
    pub fn publishes_streamed(&self) -> bool {
        self.marking == WalMarking::Delete && self.rewrites_marked
    }

    /// Whether the schema marks rows changed after their insert (read before each stream).
    pub fn set_rewrites_marked(&mut self, rewrites_marked: bool) {
        self.rewrites_marked = rewrites_marked;
    }

    /// The table source's side of the connection.
    pub fn table(&mut self) -> &mut Store<WalStatements> {
        &mut self.store
    }

    /// A claim from the table as the table source makes it (the catch-up behind a new slot),
    /// recorded as the wal source records its batches (published rows deleted with
    /// `--wal-marking delete`).
    pub async fn claim_table(
        &mut self,
        ordering: crate::config::Ordering,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(Claim<'_>, WalRecord<'_>)> {
        let (claim, statements) = self.store.claim_for(ordering, limit, max_bytes).await?;
        Ok((
            claim,
            WalRecord {
                statements,
                tids: HashMap::new(),
                defer: Vec::new(),
                undefer: Vec::new(),
            },
        ))
    }

    /// Drops the connection after an error that may have broken it; the next claim reconnects.
    pub fn reset(&mut self) {
        self.store.reset();
    }
}
