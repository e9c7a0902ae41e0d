-- A relay reports itself (outbox_relays, schema version 8): its row added at the first report and
-- updated at each one after. $8: seconds since its last publish (NULL: none yet), put on the
-- database's clock here. Rows not updated for a day (relays killed) go at the same time.
WITH gone AS (
    DELETE FROM outbox_relays WHERE seen_at < now() - interval '1 day' AND id <> $1::uuid
)
INSERT INTO outbox_relays AS r (id, host, pid, version, source, slot, interval_seconds,
                                last_publish_at, published_total, published_last_minute,
                                oldest_pending_seconds, slot_lag_bytes)
VALUES ($1::uuid, $2::text, $3::int4, $4::text, $5::text, $6::text, $7::float8,
        now() - make_interval(secs => $8::float8), $9::int8, $10::int8, $11::float8, $12::float8)
ON CONFLICT (id) DO UPDATE
SET seen_at = now(), last_publish_at = excluded.last_publish_at,
    published_total = excluded.published_total,
    published_last_minute = excluded.published_last_minute,
    oldest_pending_seconds = excluded.oldest_pending_seconds,
    slot_lag_bytes = excluded.slot_lag_bytes
