-- The later pending rows of aggregates whose head this transaction holds. Nobody else can claim
-- them (their head is pending and locked by us), so a plain lock never waits in practice.
-- $1 aggregate types, $2 aggregate ids, $3 head seqs (parallel arrays), $4 limit.
SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type, e.payload::text AS payload,
       e.headers, e.attempts, e.created_at,
       (e.dead_lettered_at IS NULL AND (e.retry_after IS NULL OR e.retry_after <= now())) AS eligible
FROM outbox_events e
JOIN unnest($1::varchar[], $2::varchar[], $3::bigint[]) AS h(aggregate_type, aggregate_id, seq)
  ON e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id AND e.seq > h.seq
WHERE e.processed_at IS NULL
ORDER BY e.seq
LIMIT $4
FOR UPDATE OF e SKIP LOCKED
