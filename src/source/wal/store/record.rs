//! What a batch of the wal source records in its transaction before the commit: the published
//! rows deleted (`--wal-marking delete`), the rows of a transaction not published whole marked and
//! its kept transactions recorded, the aggregates handed to the table and those taken back.

use foldhash::{HashMap, HashSet};

use tokio_postgres::Client;
use uuid::Uuid;

use super::{WalOpen, WalStatements};
use crate::error::Result;
use crate::event::AggregateKey;
use crate::source::store::{BeforeCommit, OpenClaim, Split};

/// What the wal source records in a batch's transaction besides its outcome: the published rows
/// deleted (`--wal-marking delete`), the aggregates handed to the table and those taken back.
pub(crate) struct WalRecord<'a> {
    pub(super) statements: &'a WalStatements,
    pub(super) tids: HashMap<Uuid, String>,
    pub defer: Vec<AggregateKey>,
    pub undefer: Vec<AggregateKey>,
}

impl WalRecord<'_> {
    /// The claim left open again, with where its rows are.
    pub fn reopen(self, open: OpenClaim) -> WalOpen {
        WalOpen {
            open,
            tids: self.tids,
        }
    }
}

impl BeforeCommit for WalRecord<'_> {
    async fn run(self, client: &Client, published: &[Uuid], split: &Split) -> Result<()> {
        self.statements
            .delete_published(client, published, split, &self.tids)
            .await?;
        self.statements
            .hand_over(client, &self.defer, &self.undefer)
            .await
    }
}

impl WalStatements {
    /// With `--wal-marking delete`: the rows whose ack arrived leave the outbox, in the batch's
    /// transaction. Rows locked by this claim are found where the claim found them (`tids`); the
    /// others (claimed from the table) by id.
    ///
    /// The rows of a transaction not published whole (`split`) are marked instead, and deleted with
    /// the rest of their transaction once it is all published: the table keeps every row of a
    /// transaction until then, so that its count (the transaction headers) is read exactly. Where
    /// the schema has `outbox_kept_transactions`, a transaction kept is recorded there, so that
    /// [`WalStore::purge_kept`](super::WalStore::purge_kept) finds it done when no batch holds it
    /// again.
    pub async fn delete_published(
        &self,
        client: &Client,
        published: &[Uuid],
        split: &Split,
        tids: &HashMap<Uuid, String>,
    ) -> Result<()> {
        let Some((by_tid, by_id)) = &self.delete_published else {
            return Ok(());
        };
        let kept: HashSet<&Uuid> = split.ids.iter().collect();
        let mut located = (Vec::new(), Vec::new());
        let mut rest = Vec::new();
        for id in published.iter().filter(|id| !kept.contains(id)) {
            match tids.get(id) {
                Some(tid) => {
                    located.0.push(tid.as_str());
                    located.1.push(*id);
                }
                None => rest.push(*id),
            }
        }
        if !located.0.is_empty() {
            by_tid.execute(client, &[&located.0, &located.1]).await?;
        }
        if !rest.is_empty() {
            by_id.execute(client, &[&rest]).await?;
        }
        // After the deletes: the purge finds a transaction done when none of its rows is pending.
        if let (Some((mark, runs, purge)), false) = (&self.split, split.txids.is_empty()) {
            if !split.ids.is_empty() {
                mark.execute(client, &[&split.ids]).await?;
            }
            if !split.runs.is_empty() {
                let txids: Vec<String> = split.runs.iter().map(|r| r.0.to_string()).collect();
                let firsts: Vec<i64> = split.runs.iter().map(|r| r.1).collect();
                let counts: Vec<i64> = split
                    .runs
                    .iter()
                    .map(|r| i64::try_from(r.2).unwrap_or(i64::MAX))
                    .collect();
                runs.execute(client, &[&txids, &firsts, &counts]).await?;
            }
            let txids: Vec<String> = split.txids.iter().map(u64::to_string).collect();
            let done = done_txids(purge.query(client, &[&txids]).await?)?;
            if let Some((record_kept, _)) = &self.kept {
                // Runs are recorded in outbox_transaction_runs already: only the others are kept
                // (recorded while not done, forgotten once done).
                let runs: HashSet<u64> = split.runs.iter().map(|r| r.0).collect();
                let (forget, keep): (Vec<String>, Vec<String>) = split
                    .txids
                    .iter()
                    .filter(|t| !runs.contains(t))
                    .map(u64::to_string)
                    .partition(|t| done.contains(t));
                if !keep.is_empty() || !forget.is_empty() {
                    record_kept.execute(client, &[&keep, &forget]).await?;
                }
            }
        }
        Ok(())
    }

    /// Records, in the batch's transaction, the aggregates handed to the table and those taken
    /// back from it.
    pub async fn hand_over(
        &self,
        client: &Client,
        defer: &[AggregateKey],
        undefer: &[AggregateKey],
    ) -> Result<()> {
        for (stmt, keys) in [(&self.defer, defer), (&self.undefer, undefer)] {
            if keys.is_empty() {
                continue;
            }
            let (types, ids): (Vec<&str>, Vec<&str>) =
                keys.iter().map(|(t, i)| (t.as_str(), i.as_str())).unzip();
            stmt.execute(client, &[&types, &ids]).await?;
        }
        Ok(())
    }
}

/// The transactions `purge_transactions.sql` found done.
pub(super) fn done_txids(rows: Vec<tokio_postgres::Row>) -> Result<Vec<String>> {
    rows.iter()
        .map(|r| Ok(r.try_get::<_, String>("txid")?))
        .collect()
}
