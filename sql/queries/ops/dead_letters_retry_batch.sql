-- One batch of `dead-letters retry --all`: a fresh set of attempts for up to $2 dead letters after
-- seq $1, in seq order. The caller continues after the highest seq returned, so each dead letter
-- is retried at most once per command, even one that a relay dead-letters again meanwhile.
WITH batch AS (
    SELECT id FROM outbox_events
    WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL AND seq > $1
    ORDER BY seq
    LIMIT $2
    FOR UPDATE)
UPDATE outbox_events e
SET dead_lettered_at = NULL, retry_after = NULL, attempts = 0
FROM batch
WHERE e.id = batch.id
RETURNING e.seq
