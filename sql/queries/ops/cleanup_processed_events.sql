-- One bounded retention step of processed_events: delete up to $2 ids recorded more than $1
-- microseconds ago by the database's clock (NULL: nothing is that old). A consumer that sees one
-- of these events again after the cutoff handles it as new, so the cutoff must be longer than any
-- redelivery (the stream's retention, a consumer's replay). SKIP LOCKED and a small LIMIT keep
-- locks short: relays and operators may run it at the same time.
DELETE FROM processed_events
WHERE event_id IN (
    SELECT event_id FROM processed_events
    WHERE processed_at < now() - $1::int8 * interval '1 microsecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
