-- The rest of claim_ordered.sql and claim_ordered_sparse.sql (appended to each): followers of the
-- heads, then the mark.
, followers AS (
    SELECT f.id, f.eligible
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT e.id,
               (e.dead_lettered_at IS NULL AND (e.retry_after IS NULL OR e.retry_after <= now()))
                   AS eligible
        FROM outbox_events e
        WHERE e.processed_at IS NULL
          AND e.aggregate_type = h.aggregate_type
          AND e.aggregate_id = h.aggregate_id
          AND e.seq > h.seq
        ORDER BY e.seq
        LIMIT (SELECT ($1 - count(*) + count(*) - 1) / greatest(count(*), 1) FROM heads)
        FOR UPDATE OF e SKIP LOCKED) f
    LIMIT $1 - (SELECT count(*) FROM heads)
), claimed AS (
    SELECT id, true AS head, true AS eligible FROM heads
    UNION ALL
    SELECT id, false, eligible FROM followers
)
UPDATE outbox_events u
SET processed_at = CASE WHEN c.eligible THEN now() END,
    retry_after  = CASE WHEN c.eligible THEN NULL ELSE u.retry_after END
FROM claimed c
WHERE u.id = c.id
RETURNING u.id, u.seq, u.aggregate_type, u.aggregate_id, u.event_type, u.payload::text AS payload,
          u.headers, u.attempts, u.created_at, c.head, c.eligible
