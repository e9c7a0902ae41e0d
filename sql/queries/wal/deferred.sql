-- --source wal, when a relay starts streaming: the aggregates handed to the table, and those with
-- a pending row that is not eligible now (dead-lettered or waiting for a retry: written that way
-- by raw SQL, or left by a relay of the table source). $1 true (after catching up from the table
-- behind a new slot): every aggregate with a pending row, since what the catch-up left behind (a
-- row held by another session) is in no stream.
SELECT aggregate_type, aggregate_id FROM outbox_wal_deferred
UNION
SELECT DISTINCT aggregate_type, aggregate_id
FROM outbox_events
WHERE processed_at IS NULL AND ($1::bool OR NOT outbox_eligible(dead_lettered_at, retry_after))
