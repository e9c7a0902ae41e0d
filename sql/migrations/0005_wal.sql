-- outbox-relay schema, version 5: what `run --source wal` needs in the schema. The publication it
-- streams from is created by `migrate --wal` (CREATE PUBLICATION needs CREATE on the database,
-- which not every migrating role has); neither is needed by the table source, which works without
-- this version.

-- outbox_wal_publication(): the publication of this outbox, fixed when the migration runs (from
-- the schema it runs in), like outbox_wakeup(). Publication names are database-wide, so each
-- outbox's schema gets its own.
DO $$
DECLARE
    s text := current_schema();
    name text := CASE
        WHEN s = 'public' THEN 'outbox_relay'
        WHEN length(s) <= 50 THEN 'outbox_relay_' || s
        ELSE 'outbox_relay_' || md5(s)
    END;
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION outbox_wal_publication() RETURNS text '
        'LANGUAGE sql IMMUTABLE AS %L',
        format('SELECT %L::text', name));
END
$$;

-- Aggregates the streaming relay handed to the table: one of their events failed (it waits for its
-- retry or is dead-lettered), or was locked by another session when its turn came. Their later
-- events stay pending in outbox_events; the relay publishes them from the table, in seq order, and
-- removes the aggregate here once it has no pending row left. Written in the transaction that
-- records the failure, before the slot's position moves past the events, so a relay that restarts
-- (or takes over) knows them without replaying anything.
CREATE TABLE IF NOT EXISTS outbox_wal_deferred (
    aggregate_type varchar(255) NOT NULL,
    aggregate_id   varchar(255) NOT NULL,
    deferred_at    timestamptz  NOT NULL DEFAULT now(),
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- Slots whose relay has caught up from the table. A new slot streams only what commits after it
-- was created; what committed before is published from the table first. A relay that dies during
-- that catch-up leaves no row here, so the next one catches up again instead of streaming past
-- rows no stream holds.
CREATE TABLE IF NOT EXISTS outbox_wal_slots (
    slot_name     text        PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    caught_up_at  timestamptz
);
