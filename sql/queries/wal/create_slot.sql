-- --source wal: create logical replication slot $1 for pgoutput. Waits for the transactions
-- running now to end (the slot starts from a consistent point); what committed before that point
-- is read from the table.
SELECT lsn::text FROM pg_create_logical_replication_slot($1::text, 'pgoutput')
