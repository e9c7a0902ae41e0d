-- --source wal, when a relay starts streaming: the aggregates handed to the table, and those with
-- a pending row that is not eligible now (dead-lettered or waiting for a retry: written that way
-- by raw SQL, left by a relay of the table source, or by the catch-up). $1 true (after catching up
-- from the table behind a new slot): every aggregate with a pending row, since what the catch-up
-- left behind (a row held by another session) is in no stream.
--
-- Those found by their rows are recorded in outbox_wal_deferred in the same statement (it commits
-- before the stream starts): the slot then confirms past their streamed events, which stay in the
-- table, and a relay that starts after a restart must find them there even when the row that
-- made them held is gone or due by then (a dead letter discarded, a retry that fell due).
WITH found AS (
    SELECT DISTINCT aggregate_type, aggregate_id
    FROM outbox_events
    WHERE processed_at IS NULL AND ($1::bool OR NOT outbox_eligible(dead_lettered_at, retry_after))
), recorded AS (
    INSERT INTO outbox_wal_deferred (aggregate_type, aggregate_id)
    SELECT aggregate_type, aggregate_id FROM found
    ON CONFLICT DO NOTHING
)
SELECT aggregate_type, aggregate_id FROM outbox_wal_deferred
UNION
SELECT aggregate_type, aggregate_id FROM found
