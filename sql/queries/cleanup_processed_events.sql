-- One bounded retention step of processed_events: delete up to $2 ids recorded before $1. A
-- consumer that sees one of these events again after the cutoff handles it as new, so the cutoff
-- must be longer than any redelivery (the stream's retention, a consumer's replay). SKIP LOCKED
-- and a small LIMIT keep locks short: relays and operators may run it at the same time.
DELETE FROM processed_events
WHERE event_id IN (
    SELECT event_id FROM processed_events
    WHERE processed_at < $1
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
