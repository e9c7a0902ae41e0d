-- Give up on dead letters for good: marked, not deleted, so the audit trail remains; marking them
-- processed releases the later events of their aggregates.
UPDATE outbox_events
SET discarded_at = now(), processed_at = now()
WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL AND id = ANY($1::uuid[])
RETURNING id
