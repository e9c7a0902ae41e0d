-- Put back rows the claim marked but that were not published (held back behind a failed or
-- ineligible row of their aggregate): pending again, exactly as before, in the same transaction.
UPDATE outbox_events
SET processed_at = NULL
WHERE id = ANY($1::uuid[])
