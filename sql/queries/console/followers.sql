-- The pending events of aggregate ($1 type, $2 id) after seq $3: what waits behind a dead letter,
-- at most $4 of them listed, with their total. Reads the pending aggregate index.
SELECT id, seq, event_type, created_at, count(*) OVER () AS total
FROM outbox_events
WHERE processed_at IS NULL AND aggregate_type = $1::text AND aggregate_id = $2::text
  AND seq > $3::int8
ORDER BY seq
LIMIT $4::int8
