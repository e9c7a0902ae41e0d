-- One bounded cleanup step: delete up to $2 rows processed (or discarded) more than $1
-- microseconds ago by the database's clock (NULL: nothing is that old). SKIP LOCKED and a small
-- LIMIT keep locks short, so it is safe while relays run.
DELETE FROM outbox_events
WHERE id IN (
    SELECT id FROM outbox_events
    WHERE processed_at IS NOT NULL AND processed_at < now() - $1::int8 * interval '1 microsecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
