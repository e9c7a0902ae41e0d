//! [`WalStore`]: a worker connection of the wal source, the table source's [`Store`] with the
//! wal statements prepared on the same connection; the table's claim recorded as the wal source
//! records its batches.

use foldhash::{HashMap, HashMapExt};

use super::{WalRecord, WalStatements};
use crate::config::WalMarking;
use crate::error::Result;
use crate::source::store::{Claim, Store};

const HAS_KEPT: &str = include_str!("../../../../sql/queries/wal/has_kept.sql");

/// A worker connection of the wal source: the table source's [`Store`] and the wal source's
/// statements on the same connection (prepared again whenever it is a new one).
pub(crate) struct WalStore {
    pub(super) store: Store,
    pub(super) marking: WalMarking,
    /// The schema marks rows changed after their insert (version 6).
    pub(super) rewrites_marked: bool,
    /// The statements, with the generation of the connection they were prepared on and whether
    /// they publish streamed content.
    pub(super) statements: Option<((u64, bool), WalStatements)>,
}

impl WalStore {
    pub fn new(store: Store, marking: WalMarking) -> WalStore {
        WalStore {
            store,
            marking,
            rewrites_marked: false,
            statements: None,
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
    pub fn table(&mut self) -> &mut Store {
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
        self.ready().await?;
        let statements = prepared(&self.statements)?;
        let claim = self.store.claim(ordering, limit, max_bytes).await?;
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

    /// The connection with the wal statements prepared on it.
    pub(super) async fn ready(&mut self) -> Result<()> {
        let streamed = self.publishes_streamed();
        let (client, generation, prepare, begin) = self.store.connection().await?;
        let key = (generation, streamed);
        if self.statements.as_ref().map(|(k, _)| *k) != Some(key) {
            // Probed and prepared inside a transaction with the session's settings: `--schema`
            // resolves.
            client.batch_execute(begin).await?;
            let has_kept = match self.marking {
                WalMarking::Delete => client
                    .query_typed(HAS_KEPT, &[])
                    .await?
                    .first()
                    .map(|row| row.try_get::<_, bool>("has_kept"))
                    .transpose()?
                    .unwrap_or(false),
                _ => false,
            };
            let statements =
                WalStatements::new(client, prepare, self.marking, key.1, has_kept).await?;
            client.batch_execute("COMMIT").await?;
            self.statements = Some((key, statements));
        }
        Ok(())
    }
}

/// The statements prepared on the store's connection (see [`WalStore::ready`]).
pub(super) fn prepared(
    statements: &Option<((u64, bool), WalStatements)>,
) -> Result<&WalStatements> {
    statements.as_ref().map(|(_, s)| s).ok_or_else(|| {
        crate::error::Error::database_state("the connection holding a claimed batch closed")
    })
}
