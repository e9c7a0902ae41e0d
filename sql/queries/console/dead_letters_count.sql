-- What a bulk action of the console would touch: the dead letters matching the filters of
-- dead_letters_page.sql ($1..$6), and the highest seq among them, which bounds the action to the
-- rows counted here (a row dead-lettered after the operator confirmed is not included).
SELECT count(*) AS matching, max(seq) AS upto
FROM outbox_events
WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL
  AND ($1::text IS NULL OR event_type = $1::text)
  AND ($2::text IS NULL OR aggregate_type = $2::text)
  AND ($3::text IS NULL OR aggregate_id = $3::text)
  AND ($4::text IS NULL OR strpos(lower(last_error), lower($4::text)) > 0)
  AND ($5::text IS NULL OR dead_lettered_at >= $5::text::timestamptz)
  AND ($6::text IS NULL OR dead_lettered_at < $6::text::timestamptz)
