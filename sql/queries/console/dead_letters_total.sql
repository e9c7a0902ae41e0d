-- How many dead letters match the filter $1..$8 (dead_letter_filter.sql), counted up to $9: the
-- list shows the total, and more than $9 as "$9+", so that the page stays fast on a million
-- (a bulk action counts them all, with dead_letters_count.sql, before it asks to confirm).
SELECT count(*) AS total
FROM (
    SELECT 1
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
) AS matching
