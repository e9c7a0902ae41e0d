-- outbox-relay schema, version 6: the wal source publishes a row from what the replication stream
-- carried (the row as its INSERT wrote it) instead of reading it again from the table, when it can
-- tell that this is the row as committed. A row changed by a later transaction has another xmin
-- than the streamed transaction id, which the relay reads when it locks the row; a row changed in
-- its own transaction keeps that xmin, so a change to a column the event is built from marks the
-- row `rewritten`, which the relay reads in the same lock. Either way the relay then reads the row
-- from the table. Writers pay nothing: the trigger fires on UPDATEs of these columns only, never
-- on INSERT, and the relay's own updates (marks, failures, retries) touch none of them but
-- `attempts` (failures, which are rare). Without this version the relay reads every row from the
-- table. Adding a nullable column without a default rewrites nothing.
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS rewritten boolean;

CREATE OR REPLACE FUNCTION outbox_mark_rewritten() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.rewritten := true;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS outbox_events_rewritten ON outbox_events;
CREATE TRIGGER outbox_events_rewritten
    BEFORE UPDATE OF id, seq, aggregate_type, aggregate_id, event_type, payload, headers, attempts,
                     created_at
    ON outbox_events
    FOR EACH ROW EXECUTE FUNCTION outbox_mark_rewritten();
