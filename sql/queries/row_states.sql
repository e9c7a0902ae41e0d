-- --source wal: what became of streamed rows that claim_ids.sql did not claim. `pending` true:
-- still to publish (held by another session, waiting for a retry, dead-lettered), so its
-- aggregate goes to the table; false: published already (a replay after a restart). A row not
-- returned was deleted.
SELECT id, processed_at IS NULL AS pending
FROM outbox_events
WHERE id = ANY($1::uuid[])
