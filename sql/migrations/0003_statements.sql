-- outbox-relay schema, version 3: rules the relay's statements share, written once.

-- A pending row may be published now: not dead-lettered, and not waiting for a retry. A row that is
-- pending but not eligible still blocks the later rows of its aggregate. `processed_at IS NULL`
-- (pending) stays in the statements themselves: it is the pending indexes' predicate, which the
-- planner must see to use them. LANGUAGE sql and STABLE (like now()), so that the planner inlines it:
-- the plans are those of the expression written out.
CREATE OR REPLACE FUNCTION outbox_eligible(dead_lettered_at timestamptz, retry_after timestamptz)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT dead_lettered_at IS NULL AND (retry_after IS NULL OR retry_after <= now())
$$;

-- Makes the calling session LISTEN on this outbox's channel (outbox_wakeup()) and returns its
-- arming key. A channel is an identifier, which no statement takes as a parameter; LISTEN takes
-- effect when the calling transaction commits. Resolved through the caller's search_path, which
-- names this outbox's schema.
CREATE OR REPLACE FUNCTION outbox_listen() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    wakeup record;
BEGIN
    SELECT * INTO wakeup FROM outbox_wakeup();
    EXECUTE format('LISTEN %I', wakeup.channel);
    RETURN wakeup.lock_key;
END
$$;
