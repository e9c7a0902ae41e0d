//! The kept transactions' purge (`--wal-marking delete`, schema version 10): rounds of the
//! transactions whose published rows the table keeps for their count, those done deleted.

use super::record::done_txids;
use super::WalStore;
use crate::error::Result;

/// Kept transactions looked at per round of [`WalStore::purge_kept`] (one probe of
/// `outbox_events_txid_idx` each).
pub(crate) const KEPT_ROUND_TRANSACTIONS: usize = 1_000;

impl WalStore {
    /// With `--wal-marking delete` on schema version 10: a round of the transactions whose
    /// published rows (or run) are kept, as `outbox_kept_transactions` and
    /// `outbox_transaction_runs` record them, at most [`KEPT_ROUND_TRANSACTIONS`] by txid after
    /// `after` ("0": from the start). Those with no pending row left (their other events
    /// published or discarded) leave the outbox in the round's transaction, whoever published
    /// them. Returns the last transaction looked at when the round was full (the next round starts
    /// after it), `None` when it reached the end; and how many were done. Nothing on an older
    /// schema or with marking.
    pub async fn purge_kept(&mut self, after: &str) -> Result<(Option<String>, usize)> {
        // Nothing to purge without them: no transaction opened for it.
        let wal = self.store.theirs().await?;
        if wal.split.is_none() || wal.kept.is_none() {
            return Ok((None, 0));
        }
        let (claim, wal) = self.store.begin().await?;
        let (Some((_, _, purge)), Some((record_kept, round))) = (&wal.split, &wal.kept) else {
            claim.rollback().await?;
            return Ok((None, 0));
        };
        let client = claim.client();
        let limit = i64::try_from(KEPT_ROUND_TRANSACTIONS).unwrap_or(i64::MAX);
        let candidates = round
            .query(client, &[&after, &limit])
            .await?
            .iter()
            .map(|r| Ok(r.try_get::<_, String>("txid")?))
            .collect::<Result<Vec<String>>>()?;
        if candidates.is_empty() {
            claim.rollback().await?;
            return Ok((None, 0));
        }
        let done = done_txids(purge.query(client, &[&candidates]).await?)?;
        if !done.is_empty() {
            record_kept
                .execute(client, &[&Vec::<String>::new(), &done])
                .await?;
        }
        claim.commit().await?;
        let next = (candidates.len() >= KEPT_ROUND_TRANSACTIONS)
            .then(|| candidates.last().cloned())
            .flatten();
        Ok((next, done.len()))
    }
}
