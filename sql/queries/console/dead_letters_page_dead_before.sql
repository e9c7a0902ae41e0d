-- The page before, by time dead: the dead letters matching the filter $1..$8
-- (dead_letter_filter.sql) before ($9 dead_lettered_at, $10 seq), the nearest first, at most $11
-- rows (the page shows them the other way round). Keyset on (dead_lettered_at, seq), as
-- dead_letters_page_dead.sql.
SELECT id, seq, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at,
       dead_lettered_at
FROM outbox_events
WHERE /* dead_letter_filter.sql */
  AND (dead_lettered_at, seq) < ($9::timestamptz, $10::int8)
ORDER BY dead_lettered_at DESC, seq DESC
LIMIT $11::int8
