-- One bounded cleanup step: delete up to $2 rows processed (or discarded) before $1.
-- SKIP LOCKED and a small LIMIT keep locks short, so it is safe while relays run.
DELETE FROM outbox_events
WHERE id IN (
    SELECT id FROM outbox_events
    WHERE processed_at IS NOT NULL AND processed_at < $1
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
