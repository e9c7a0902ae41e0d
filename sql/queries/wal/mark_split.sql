-- --source wal with --wal-marking delete: the published rows of a transaction the batch did not
-- publish whole ($1) are marked, not deleted, in the batch's transaction: the table keeps every
-- row of a transaction until all of them are published, so that its count, which the
-- Outbox-Transaction-* headers of its other events are computed from (transactions.sql), stays
-- exact. purge_transactions.sql deletes them once the transaction is done, found by a batch that
-- holds it or, as record_kept.sql records it (schema version 10), by a round of the kept ones.
UPDATE outbox_events
SET processed_at = now(), retry_after = NULL
WHERE id = ANY($1::uuid[])
