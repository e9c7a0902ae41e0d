-- outbox-relay status: the replication slots this outbox's relays of --source wal created (schema
-- version 5), as PostgreSQL sees them: missing (dropped), active (a relay streams), wal_status
-- ('lost': invalidated by max_slot_wal_keep_size), the WAL they keep and what is not confirmed
-- yet, and the aggregates handed to the table.
SELECT w.slot_name,
       s.slot_name IS NOT NULL AS present,
       coalesce(s.active, false) AS active,
       s.wal_status,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::float8 AS retained_bytes,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::float8 AS unconfirmed_bytes,
       w.caught_up_at IS NOT NULL AS caught_up,
       (SELECT count(*) FROM outbox_wal_deferred) AS deferred_aggregates
FROM outbox_wal_slots w
LEFT JOIN pg_replication_slots s ON s.slot_name = w.slot_name
ORDER BY w.slot_name
