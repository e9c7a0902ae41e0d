-- --source wal with --wal-marking delete: the transactions of consecutive seqs ($1 txid as text,
-- $2 first seq, $3 count) the batch published part of, whose rows it deletes: their first seq
-- and count are kept (once per transaction) until the whole transaction is published, for the
-- transaction headers of their other events (transactions.sql).
INSERT INTO outbox_transaction_runs (txid, first_seq, events)
SELECT r.txid::xid8, r.first_seq, r.events
FROM unnest($1::text[], $2::int8[], $3::int8[]) AS r(txid, first_seq, events)
ON CONFLICT (txid) DO NOTHING
