-- --ordering none: the oldest claimable rows, whatever their aggregate.
SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type, e.payload::text AS payload,
       e.headers, e.attempts, e.created_at, true AS eligible
FROM outbox_events e
WHERE e.processed_at IS NULL
  AND e.dead_lettered_at IS NULL
  AND (e.retry_after IS NULL OR e.retry_after <= now())
ORDER BY e.seq
LIMIT $1
FOR UPDATE OF e SKIP LOCKED
