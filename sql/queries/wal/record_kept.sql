-- --source wal with --wal-marking delete (schema version 10), in the batch's transaction (or a
-- round's, kept_round.sql): the transactions ($1, txid as text) whose published rows
-- mark_split.sql keeps are recorded, so that the rows go once the transaction is done whoever
-- sees that, not only a batch that holds it again; those purge_transactions.sql found done ($2)
-- are forgotten.
WITH forget AS (
    DELETE FROM outbox_kept_transactions
    WHERE txid = ANY($2::text[]::xid8[])
)
INSERT INTO outbox_kept_transactions (txid)
SELECT t.txid::xid8
FROM unnest($1::text[]) AS t(txid)
ON CONFLICT (txid) DO NOTHING
