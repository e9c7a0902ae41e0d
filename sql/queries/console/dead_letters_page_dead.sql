-- One page of the console's dead-letter list by time dead: the dead letters matching the filter
-- $1..$8 (dead_letter_filter.sql) after ($9 dead_lettered_at, $10 seq), in that order, at most $11
-- rows. Keyset on (dead_lettered_at, seq), which an index on those two columns over the dead
-- letters (WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL) serves as it stands: a
-- page deep in a million dead letters then costs what the first does. Without that index, the
-- matching rows are sorted.
SELECT id, seq, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at,
       dead_lettered_at
FROM outbox_events
WHERE /* dead_letter_filter.sql */
  AND (dead_lettered_at, seq) > ($9::timestamptz, $10::int8)
ORDER BY dead_lettered_at, seq
LIMIT $11::int8
