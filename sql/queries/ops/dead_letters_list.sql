-- $1 limit, $2 event type filter (NULL = all).
SELECT id, seq, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at,
       dead_lettered_at, payload::text AS payload
FROM outbox_dead_letters
WHERE $2::text IS NULL OR event_type = $2::text
ORDER BY seq
LIMIT $1
