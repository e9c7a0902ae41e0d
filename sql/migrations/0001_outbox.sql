-- outbox-relay schema, version 1.
-- The first columns match the classic outbox writer, so
--   INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4)
-- keeps working unchanged. Everything after `payload` is for the relay.

CREATE TABLE IF NOT EXISTS outbox_events (
    id               uuid         PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type   varchar(255) NOT NULL,
    aggregate_id     varchar(255) NOT NULL,
    event_type       varchar(100) NOT NULL,
    payload          jsonb        NOT NULL,
    attempts         int          NOT NULL DEFAULT 0,
    created_at       timestamptz  NOT NULL DEFAULT now(),
    processed_at     timestamptz,
    -- Commit order within one transaction is invisible to created_at (same now()); seq is not.
    seq              bigint       GENERATED ALWAYS AS IDENTITY,
    retry_after      timestamptz,
    last_error       text,
    headers          jsonb,
    dead_lettered_at timestamptz,
    -- A discarded dead letter is done with (processed_at is set too) but kept for the audit trail.
    discarded_at     timestamptz
);

-- The relay only ever looks at pending rows; keep that index small however many rows were published.
CREATE INDEX IF NOT EXISTS outbox_events_pending_seq_idx
    ON outbox_events (seq) WHERE processed_at IS NULL;

-- Per-aggregate ordering asks "is there an older pending row of this aggregate?" for every candidate.
CREATE INDEX IF NOT EXISTS outbox_events_pending_aggregate_idx
    ON outbox_events (aggregate_type, aggregate_id, seq) WHERE processed_at IS NULL;

-- Rows the relay gave up on. A dead letter still blocks the later events of its own aggregate.
CREATE OR REPLACE VIEW outbox_dead_letters AS
SELECT id, seq, aggregate_type, aggregate_id, event_type, payload, headers,
       attempts, last_error, created_at, dead_lettered_at
FROM outbox_events
WHERE dead_lettered_at IS NOT NULL AND processed_at IS NULL;

-- For idempotent consumers: one row per event id handled (see outbox_relay::process_once).
CREATE TABLE IF NOT EXISTS processed_events (
    event_id     uuid        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- Wake the relay. Statement level with an empty payload: one notification per transaction at most,
-- because PostgreSQL folds identical notifications sent by one transaction.
--
-- A transaction that notifies takes a database-wide lock at commit, so notifying writers commit one
-- at a time. They only need to notify while a relay is idle and waiting. An idle relay "arms" by
-- holding advisory key 7250010002 exclusively on its listener connection; the shared try-lock below
-- then fails and the writer notifies. While no relay is armed (all are busy draining, and will poll
-- again anyway) the try-lock succeeds, the writer skips the notification, and the shared lock it now
-- holds until commit makes a relay that arms next wait for this transaction to commit before its
-- catch-up poll, so no row is missed. Advisory locks ignore MVCC snapshots, so this holds at every
-- isolation level.
CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(7250010002) THEN
        PERFORM pg_notify('outbox_event', '');
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS outbox_events_notify ON outbox_events;
CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();
