-- --source wal with --wal-marking delete (schema version 10): a round of the transactions whose
-- published rows are kept (outbox_kept_transactions) or whose run is (outbox_transaction_runs),
-- by txid after $1 (text; '0' from the start), at most $2: purge_transactions.sql deletes what it
-- finds done. No batch needs to hold them: a transaction whose last pending event was discarded
-- is found here. Each table is read along its primary key from $1, $2 rows at most.
SELECT c.txid::text AS txid
FROM (
    (SELECT k.txid FROM outbox_kept_transactions k
     WHERE k.txid > $1::text::xid8 ORDER BY k.txid LIMIT $2)
    UNION
    (SELECT r.txid FROM outbox_transaction_runs r
     WHERE r.txid > $1::text::xid8 ORDER BY r.txid LIMIT $2)
) AS c
ORDER BY c.txid
LIMIT $2
