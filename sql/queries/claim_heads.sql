-- Claim up to $1 claimable aggregate heads: pending rows with no older pending row of the same
-- aggregate. A row that is waiting for a retry or dead-lettered is still pending, so it keeps
-- blocking the later rows of its aggregate (that is what keeps per-aggregate order).
SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type, e.payload::text AS payload,
       e.headers, e.attempts, e.created_at, true AS eligible
FROM outbox_events e
WHERE e.processed_at IS NULL
  AND e.dead_lettered_at IS NULL
  AND (e.retry_after IS NULL OR e.retry_after <= now())
  AND NOT EXISTS (
        SELECT 1 FROM outbox_events o
        WHERE o.processed_at IS NULL
          AND o.aggregate_type = e.aggregate_type
          AND o.aggregate_id = e.aggregate_id
          AND o.seq < e.seq)
ORDER BY e.seq
LIMIT $1
FOR UPDATE OF e SKIP LOCKED
