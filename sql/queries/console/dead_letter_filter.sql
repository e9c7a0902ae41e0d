-- The dead letters matching the filter of the console's dead-letter list. The condition between
-- the dead_letter_filter.sql markers is written out, exactly as here, in each statement that
-- applies the filter (the list, its count, the bulk batches and the causes), so that an action
-- touches exactly what the list shows; a unit test keeps the copies equal (console::queries).
-- $1 event type, $2 aggregate type, $3 aggregate id, $4 text in last_error (any case), $5 and $6
-- dead-lettered from and before, $7 the cause (error_cause.sql); NULL: any. $8: with $7, a word of
-- the cause that every error of that cause contains (the longest between its placeholders and
-- spaces), tested first: a substring search costs a fraction of the cause's regular expressions,
-- so a rare cause among a million dead letters is found at the cost of that search.
SELECT id, seq
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
