-- --source wal with --wal-marking delete: the rows of these transactions ($1: txid as text) that
-- mark_split.sql kept, and what record_runs.sql kept of them, are deleted once none of the
-- transaction's rows is pending any more, in the batch's transaction, or in a round of the kept
-- ones (kept_round.sql). Discarded dead letters stay for the audit trail, as they do in the table
-- source: a transaction with a discarded event is done once its others are published. Returns
-- the transactions found done (forget_kept.sql forgets them). The pending row, if any, is looked for from the transaction's newest row
-- down (outbox_events_txid_idx backwards): a transaction published in order has its pending rows
-- last, so the look stops at once until the transaction is done.
WITH done AS (
    SELECT t.txid
    FROM unnest($1::text[]) AS d(txid)
    CROSS JOIN LATERAL (SELECT d.txid::xid8 AS txid) AS t
    -- `coalesce(...)`: not the pending rows' partial indexes, which a plan made on other
    -- statistics took (backward through every pending row until one of this transaction: a
    -- scan of the backlog per batch); only outbox_events_txid_idx serves this.
    WHERE (SELECT p.seq FROM outbox_events p
           WHERE p.txid = t.txid AND coalesce(p.processed_at IS NULL, false)
           ORDER BY p.txid DESC, p.seq DESC
           LIMIT 1) IS NULL
), rows AS (
    DELETE FROM outbox_events o
    USING done
    WHERE o.txid = done.txid AND o.processed_at IS NOT NULL AND o.discarded_at IS NULL
), runs AS (
    DELETE FROM outbox_transaction_runs r
    USING done
    WHERE r.txid = done.txid
)
SELECT done.txid::text AS txid FROM done
