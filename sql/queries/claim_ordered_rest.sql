-- The rest of claim_ordered.sql and claim_ordered_sparse.sql (appended to each): followers of the
-- heads, then the mark.
, followers AS (
    SELECT f.id
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT e.id
        FROM outbox_events e
        WHERE e.processed_at IS NULL
          AND e.aggregate_type = h.aggregate_type
          AND e.aggregate_id = h.aggregate_id
          AND e.seq > h.seq
        ORDER BY e.seq
        -- ceil(($1 - heads) / heads): an equal share of the room left after the heads
        LIMIT (SELECT ($1 - 1) / greatest(count(*), 1) FROM heads)
        FOR UPDATE OF e SKIP LOCKED) f
    LIMIT $1 - (SELECT count(*) FROM heads)
), claimed AS (
    SELECT id FROM heads
    UNION ALL
    SELECT id FROM followers
)
-- One primary-key probe per claimed row (`= ANY(ARRAY(...))`, not a join: with the statistics of a
-- table that grew since its last analyze the planner may otherwise scan the table once per row).
-- Eligibility is recomputed from the row itself (same now() as in the claim); RETURNING gives it
-- back as "processed_at was set". The relay tells heads from followers by seq within the batch.
UPDATE outbox_events u
SET processed_at = CASE WHEN u.dead_lettered_at IS NULL
                             AND (u.retry_after IS NULL OR u.retry_after <= now())
                        THEN now() END,
    retry_after  = CASE WHEN u.dead_lettered_at IS NULL
                             AND (u.retry_after IS NULL OR u.retry_after <= now())
                        THEN NULL ELSE u.retry_after END
WHERE u.id = ANY(ARRAY(SELECT id FROM claimed))
RETURNING u.id, u.seq, u.aggregate_type, u.aggregate_id, u.event_type, u.payload::text AS payload,
          u.headers, u.attempts, u.created_at, u.processed_at IS NOT NULL AS eligible
