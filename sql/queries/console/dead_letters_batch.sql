-- One batch of a console bulk action: the ids of at most $11 dead letters matching the filter
-- $1..$8 (dead_letter_filter.sql) with seq after $9 and up to $10, in seq order. The ids then go
-- through the operator commands' own retry or discard (which also wakes the relays).
SELECT id, seq
FROM outbox_events
WHERE /* dead_letter_filter.sql */
  AND seq > $9::int8 AND seq <= $10::int8
ORDER BY seq
LIMIT $11::int8
