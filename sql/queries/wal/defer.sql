-- --source wal: hand aggregates ($1 types, $2 ids) to the table, inside the batch's transaction
-- (see outbox_wal_deferred in the version 5 migration).
INSERT INTO outbox_wal_deferred (aggregate_type, aggregate_id)
SELECT * FROM unnest($1::text[], $2::text[])
ON CONFLICT DO NOTHING
