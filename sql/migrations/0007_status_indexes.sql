-- outbox-relay schema, version 7: a partial index of the dead letters for what `outbox-relay
-- status`, the relay's gauges and the console's overview read. Without it those reads visit every
-- pending row to count the dead letters and the aggregates they block: seconds on a million dead
-- letters. The relay and the operator commands work on a schema without this version (the relay
-- needs version 3), only slower.
--
-- outbox_events_dead_letters_idx: the dead letters by aggregate. Counts the dead letters and the
-- aggregates they block without a visit to the table, and finds each aggregate's first dead
-- letter. An entry is written when a row is dead-lettered, never by a writer's INSERT or by a
-- publish: writers and drains pay nothing for it. (Indexes of the queued rows and of the published
-- rows would make the overview faster still, 0.2 s instead of about 0.6 s on a million dead
-- letters, but every INSERT or every publish would pay an index entry: left out.)
--
-- Plain CREATE INDEX, inside the migration's transaction like every other version: `migrate` and
-- `migrate --print` stay one all-or-nothing transaction under the migration lock. The build blocks
-- writes to outbox_events (writers' INSERTs and the relay's marks wait; reads do not) for as long
-- as it takes, which only depends on the dead letters: a moment unless they are millions. Then
-- build it first without blocking writers, outside any transaction (psql, autocommit):
--
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_dead_letters_idx
--       ON outbox_events (aggregate_type, aggregate_id, seq)
--       WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL;
--
-- then migrate: IF NOT EXISTS finds it and this version only records itself. A CONCURRENTLY build
-- that failed or is still running leaves an INVALID index, which IF NOT EXISTS would accept as
-- done; it is refused below with what to do instead.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_index
               WHERE indexrelid = to_regclass('outbox_events_dead_letters_idx')
                 AND NOT indisvalid) THEN
        RAISE EXCEPTION 'index outbox_events_dead_letters_idx is INVALID (a CREATE INDEX CONCURRENTLY that failed or is still running)'
            USING HINT = 'wait for the build to finish, or DROP INDEX CONCURRENTLY outbox_events_dead_letters_idx and build it again; then run migrate';
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS outbox_events_dead_letters_idx
    ON outbox_events (aggregate_type, aggregate_id, seq)
    WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL;
