-- One page of the console's dead-letter list, in seq order after seq $9, at most $10 rows, with
-- the filter $1..$8 (dead_letter_filter.sql). Keyset on seq, so a page deep in a million dead
-- letters costs what the first does.
SELECT id, seq, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at,
       dead_lettered_at
FROM outbox_events
WHERE /* dead_letter_filter.sql */
  AND seq > $9::int8
ORDER BY seq
LIMIT $10::int8
