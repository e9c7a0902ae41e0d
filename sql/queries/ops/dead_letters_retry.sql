-- Give dead letters a fresh set of attempts. $1 ids, or NULL for all of them.
UPDATE outbox_events
SET dead_lettered_at = NULL, retry_after = NULL, attempts = 0
WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL
  AND ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
RETURNING id
