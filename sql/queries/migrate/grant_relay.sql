-- Statements granting a relay role what the relay and the operator commands need: read, mark,
-- delete outbox rows, read the schema version and the dead letters, and delete old rows of
-- processed_events (`--processed-events-retention`; the row locks of its FOR UPDATE SKIP LOCKED
-- need UPDATE on a column). LISTEN and advisory locks need no grant. The relay does not own
-- anything. $1 = role.
SELECT format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), $1::text)
UNION ALL SELECT format('GRANT SELECT, UPDATE, DELETE ON outbox_events TO %I', $1::text)
UNION ALL SELECT format('GRANT SELECT ON outbox_dead_letters TO %I', $1::text)
UNION ALL SELECT format('GRANT SELECT ON outbox_schema_migrations TO %I', $1::text)
UNION ALL SELECT format('GRANT SELECT, DELETE, UPDATE (processed_at) ON processed_events TO %I', $1::text)
-- --source wal: the aggregates it handed to the table (schema version 5; the role also needs the
-- REPLICATION attribute, which only a superuser grants: ALTER ROLE ... REPLICATION).
UNION ALL SELECT format('GRANT SELECT, INSERT, DELETE ON outbox_wal_deferred TO %I', $1::text)
WHERE to_regclass('outbox_wal_deferred') IS NOT NULL
UNION ALL SELECT format('GRANT SELECT, INSERT, UPDATE ON outbox_wal_slots TO %I', $1::text)
WHERE to_regclass('outbox_wal_slots') IS NOT NULL
-- The relays reporting themselves (schema version 8).
UNION ALL SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relays TO %I', $1::text)
WHERE to_regclass('outbox_relays') IS NOT NULL
-- The counts of transactions the wal source publishes over several batches (schema version 9).
UNION ALL SELECT format('GRANT SELECT, INSERT, DELETE ON outbox_transaction_runs TO %I', $1::text)
WHERE to_regclass('outbox_transaction_runs') IS NOT NULL
-- The transactions whose rows the wal source keeps for their count (schema version 10).
UNION ALL SELECT format('GRANT SELECT, INSERT, DELETE ON outbox_kept_transactions TO %I', $1::text)
WHERE to_regclass('outbox_kept_transactions') IS NOT NULL
