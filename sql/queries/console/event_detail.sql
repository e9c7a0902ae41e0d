-- The console's detail view of one event ($1 id): payload and headers pretty-printed by the
-- database, every timestamp, its state, and the database's clock (`now`, for the ages shown).
SELECT id, seq, aggregate_type, aggregate_id, event_type, jsonb_pretty(payload) AS payload,
       jsonb_pretty(headers) AS headers, attempts, last_error, created_at, dead_lettered_at,
       retry_after, processed_at, discarded_at, clock_timestamp() AS now
FROM outbox_events
WHERE id = $1::uuid
