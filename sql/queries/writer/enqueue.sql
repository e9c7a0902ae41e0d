INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT * FROM unnest($1::varchar[], $2::varchar[], $3::varchar[], $4::jsonb[], $5::jsonb[])
RETURNING id
