-- The page before: the console's dead letters matching the filter $1..$8 (dead_letter_filter.sql)
-- with seq below $9, the nearest first, at most $10 rows (the page shows them in seq order). Keyset
-- on seq, as dead_letters_page.sql.
SELECT id, seq, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at,
       dead_lettered_at
FROM outbox_events
WHERE /* dead_letter_filter.sql */
  AND seq < $9::int8
ORDER BY seq DESC
LIMIT $10::int8
