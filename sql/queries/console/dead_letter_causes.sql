-- The console's dead letters grouped by cause (error_cause.sql), most frequent first, at most $10
-- causes: how many, first and last dead-lettered, among at most $9 dead letters matching the
-- filter $1..$8 (dead_letter_filter.sql) and how many that was (`looked_at`: below $9, every
-- match). The bound keeps the page fast with a million dead letters: the cause is a few regular
-- expressions per row.
WITH matching AS (
    SELECT last_error, dead_lettered_at
    FROM outbox_events
    WHERE /* dead_letter_filter.sql */ processed_at IS NULL AND dead_lettered_at IS NOT NULL
  AND ($1::text IS NULL OR event_type = $1::text)
  AND ($2::text IS NULL OR aggregate_type = $2::text)
  AND ($3::text IS NULL OR aggregate_id = $3::text)
  AND ($4::text IS NULL OR strpos(lower(last_error), lower($4::text)) > 0)
  AND ($5::text IS NULL OR dead_lettered_at >= $5::text::timestamptz)
  AND ($6::text IS NULL OR dead_lettered_at < $6::text::timestamptz)
  AND ($7::text IS NULL
       OR (coalesce(strpos(last_error, $8::text), 1) > 0 AND /* error_cause.sql */ (coalesce(nullif(left(btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
    coalesce(last_error, ''),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
    '"[^"]*"|''[^'']*''', '"..."', 'g'),
    '0x[0-9a-fA-F]+', '<n>', 'g'),
    '[0-9]+', '<n>', 'g'),
    '\s+', ' ', 'g')), 300), ''), '(no error text)')) /* end error_cause.sql */ = $7::text)) /* end dead_letter_filter.sql */
    LIMIT $9::int8
)
SELECT /* error_cause.sql */ (coalesce(nullif(left(btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
    coalesce(last_error, ''),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
    '"[^"]*"|''[^'']*''', '"..."', 'g'),
    '0x[0-9a-fA-F]+', '<n>', 'g'),
    '[0-9]+', '<n>', 'g'),
    '\s+', ' ', 'g')), 300), ''), '(no error text)')) /* end error_cause.sql */ AS cause, count(*) AS dead_letters,
       min(dead_lettered_at) AS first_seen, max(dead_lettered_at) AS last_seen,
       (SELECT count(*) FROM matching) AS looked_at
FROM matching
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT $10::int8
