-- One batch of a console bulk action: the ids of at most $9 dead letters matching the filters of
-- dead_letters_page.sql ($1..$6) with seq after $7 and up to $8, in seq order. The ids then go
-- through the operator commands' own retry or discard (which also wakes the relays).
SELECT id, seq
FROM outbox_events
WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL
  AND ($1::text IS NULL OR event_type = $1::text)
  AND ($2::text IS NULL OR aggregate_type = $2::text)
  AND ($3::text IS NULL OR aggregate_id = $3::text)
  AND ($4::text IS NULL OR strpos(lower(last_error), lower($4::text)) > 0)
  AND ($5::text IS NULL OR dead_lettered_at >= $5::text::timestamptz)
  AND ($6::text IS NULL OR dead_lettered_at < $6::text::timestamptz)
  AND seq > $7::int8 AND seq <= $8::int8
ORDER BY seq
LIMIT $9::int8
