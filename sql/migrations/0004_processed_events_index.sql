-- outbox-relay schema, version 4: an index for the retention of processed_events
-- (`cleanup --processed-events-older-than`, `run --processed-events-retention`), which deletes by
-- `processed_at < cutoff`. Without it each cleanup batch scans the table; the relay and the
-- cleanup work on a schema without this version (the relay needs version 3), only slower.
--
-- A plain CREATE INDEX, inside the migration's transaction like every other version: `migrate`
-- and `migrate --print` stay one all-or-nothing transaction under the migration lock. The build
-- blocks writes to processed_events (consumers' `process_once` INSERTs wait; reads do not) for as
-- long as it takes: a moment on a small table, minutes on hundreds of millions of rows. For a large
-- table, build the index first without blocking writers, outside any transaction (psql, autocommit):
--
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS processed_events_processed_at_idx
--       ON processed_events (processed_at);
--
-- then migrate: IF NOT EXISTS finds it and this version only records itself. A CONCURRENTLY build
-- that failed or is still running leaves an INVALID index, which IF NOT EXISTS would accept as
-- done; it is refused below with what to do instead.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_index
               WHERE indexrelid = to_regclass('processed_events_processed_at_idx')
                 AND NOT indisvalid) THEN
        RAISE EXCEPTION 'index processed_events_processed_at_idx is INVALID (a CREATE INDEX CONCURRENTLY that failed or is still running)'
            USING HINT = 'wait for the build to finish, or DROP INDEX CONCURRENTLY processed_events_processed_at_idx and build it again; then run migrate';
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS processed_events_processed_at_idx
    ON processed_events (processed_at);
