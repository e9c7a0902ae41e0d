-- --ordering none: claim and mark, in one statement, the oldest claimable rows whatever their
-- aggregate. As claim_ordered.sql, this runs inside the batch's transaction, which commits only
-- after the acks; rows that were not acknowledged are put back before the commit.
WITH claimed AS (
    SELECT e.id
    FROM outbox_events e
    WHERE e.processed_at IS NULL
      AND e.dead_lettered_at IS NULL
      AND (e.retry_after IS NULL OR e.retry_after <= now())
    ORDER BY e.seq
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE outbox_events u
SET processed_at = now(), retry_after = NULL
WHERE u.id = ANY(ARRAY(SELECT id FROM claimed)) -- primary-key probes, see claim_ordered_rest.sql
RETURNING u.id, u.seq, u.aggregate_type, u.aggregate_id, u.event_type, u.payload::text AS payload,
          u.headers, u.attempts, u.created_at, true AS eligible
