-- The relays that report themselves in outbox_relays (schema version 8), one row each, the oldest
-- first: what each said at its last report (its own figures, as its /metrics has them), and how
-- long ago that report was by the database's clock.
SELECT host, pid, version, source, slot, interval_seconds, started_at, last_publish_at,
       published_last_minute, oldest_pending_seconds, slot_lag_bytes,
       EXTRACT(EPOCH FROM now() - seen_at)::float8 AS seen_seconds_ago
FROM outbox_relays
ORDER BY started_at, id
LIMIT 100
