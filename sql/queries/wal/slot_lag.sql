-- --source wal: WAL the slot $1 keeps (from its restart_lsn) in bytes, for
-- outbox_replication_lag_bytes; no row while the slot does not exist.
SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::float8 AS retained_bytes
FROM pg_replication_slots
WHERE slot_name = $1::text
