-- One page of the console's dead-letter list, in seq order after seq $7, at most $8 rows. Filters
-- ($1 event type, $2 aggregate type, $3 aggregate id, $4 text in last_error (any case), $5 and $6
-- dead-lettered from and before; NULL: any) are shared with the count and the bulk batches, so
-- that an action touches exactly what the list shows. Keyset on seq, so a page deep in a million
-- dead letters costs what the first does.
SELECT id, seq, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at,
       dead_lettered_at
FROM outbox_events
WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL
  AND ($1::text IS NULL OR event_type = $1::text)
  AND ($2::text IS NULL OR aggregate_type = $2::text)
  AND ($3::text IS NULL OR aggregate_id = $3::text)
  AND ($4::text IS NULL OR strpos(lower(last_error), lower($4::text)) > 0)
  AND ($5::text IS NULL OR dead_lettered_at >= $5::text::timestamptz)
  AND ($6::text IS NULL OR dead_lettered_at < $6::text::timestamptz)
  AND seq > $7::int8
ORDER BY seq
LIMIT $8::int8
