UPDATE outbox_events
SET processed_at = now(), retry_after = NULL
WHERE id = ANY($1::uuid[])
