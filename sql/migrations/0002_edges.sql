-- outbox-relay schema, version 2.
--
-- 1. `seq` is unique among pending rows. Two pending rows of one aggregate with the same seq (written
--    with OVERRIDING SYSTEM VALUE, or restored by COPY) would both count as the aggregate's head.
-- 2. The NOTIFY channel and the arming key belong to this outbox's schema, so that two outboxes in
--    one database (`--schema a`, `--schema b`) never wake or cover each other. The default schema
--    keeps version 1's channel `outbox_event` and key 7250010002.

-- An identity sequence behind rows restored with their own seq would hand out values they hold.
DO $$
DECLARE
    sequence regclass := pg_get_serial_sequence('outbox_events', 'seq')::regclass;
    top bigint;
BEGIN
    SELECT max(seq) INTO top FROM outbox_events;
    IF top > coalesce(pg_sequence_last_value(sequence), 0) THEN
        PERFORM setval(sequence, top);
    END IF;
END
$$;

-- Pending rows that share their seq with a pending row of a smaller id move to the end, in (seq, id)
-- order, together with every later pending row of their aggregate: each aggregate keeps its order,
-- ties broken by id.
DO $$
DECLARE
    moved uuid;
BEGIN
    FOR moved IN
        WITH dup AS (
            SELECT e.aggregate_type, e.aggregate_id, e.seq, e.id
            FROM outbox_events e
            WHERE e.processed_at IS NULL
              AND EXISTS (SELECT 1 FROM outbox_events o
                          WHERE o.processed_at IS NULL AND o.seq = e.seq AND o.id < e.id)
        ), first_moved AS (
            SELECT DISTINCT ON (aggregate_type, aggregate_id) aggregate_type, aggregate_id, seq, id
            FROM dup
            ORDER BY aggregate_type, aggregate_id, seq, id
        )
        SELECT e.id
        FROM outbox_events e
        JOIN first_moved f USING (aggregate_type, aggregate_id)
        WHERE e.processed_at IS NULL AND (e.seq, e.id) >= (f.seq, f.id)
        ORDER BY e.seq, e.id
    LOOP
        UPDATE outbox_events SET seq = DEFAULT WHERE id = moved;
    END LOOP;
END
$$;

CREATE UNIQUE INDEX IF NOT EXISTS outbox_events_pending_seq_key
    ON outbox_events (seq) WHERE processed_at IS NULL;
DROP INDEX IF EXISTS outbox_events_pending_seq_idx;

-- Bytes a row takes in the relay, for the batch byte budget (`--max-batch-bytes`). Small values are
-- stored uncompressed, so their stored size is close to their text; a large one may be compressed
-- far below what the relay receives, so it is measured as text. STABLE like pg_column_size, so
-- that the planner inlines it.
CREATE OR REPLACE FUNCTION outbox_row_size(payload jsonb, headers jsonb) RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN pg_column_size(payload) < 2048 THEN pg_column_size(payload)
                ELSE octet_length(payload::text) END
           + coalesce(pg_column_size(headers), 0)
$$;

-- outbox_wakeup(): this outbox's NOTIFY channel and arming key, fixed when the migration runs (from
-- the schema it runs in) so that writers compute nothing. The relay reads both from here; the
-- trigger function below has the same values written in.
DO $$
DECLARE
    s text := current_schema();
    channel text := CASE
        WHEN s = 'public' THEN 'outbox_event'
        WHEN length(s) <= 50 THEN 'outbox_event_' || s
        ELSE 'outbox_event_' || md5(s)
    END;
    lock_key bigint := CASE
        WHEN s = 'public' THEN 7250010002
        ELSE hashtextextended('outbox-relay:' || s, 7250010002)
    END;
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION outbox_wakeup(OUT channel text, OUT lock_key bigint) '
        'LANGUAGE sql IMMUTABLE AS %L',
        format('SELECT %L::text, %s::bigint', channel, lock_key));
    -- See version 1 for how arming gates the notifications.
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger LANGUAGE plpgsql AS %L',
        format('BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(%s) THEN
        PERFORM pg_notify(%L, '''');
    END IF;
    RETURN NULL;
END', lock_key, channel));
END
$$;
