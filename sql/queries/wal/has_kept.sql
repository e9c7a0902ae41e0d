-- --source wal with --wal-marking delete: does the outbox record the transactions whose published
-- rows are kept (schema version 10: outbox_kept_transactions)? A relay on version 9 keeps them as
-- before, found done only by a batch that holds the transaction.
SELECT to_regclass('outbox_kept_transactions') IS NOT NULL AS has_kept
