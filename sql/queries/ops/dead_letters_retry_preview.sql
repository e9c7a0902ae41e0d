-- What `dead-letters retry --dry-run` reports: the dead letters that retry would change. $1 ids,
-- or NULL for all of them.
SELECT id, aggregate_type, aggregate_id, event_type
FROM outbox_events
WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL
  AND ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
ORDER BY seq
