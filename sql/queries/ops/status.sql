-- Operator overview (outbox-relay status, the relay's gauges, the console). Every time is compared
-- with the database's own now(), never with a client's clock. $1: the blocked aggregates are
-- counted up to this many (NULL: all of them).
--
-- Three reads: the queue's counts and ages from the pending rows that are not dead letters (the
-- pending indexes), and the dead letters and the aggregates they block from the dead-letter index
-- of version 7 alone (without it, from the pending indexes, only slower).
WITH queued AS (
    SELECT
        count(*)                                                                             AS pending,
        -- Rows written by raw SQL may hold ±infinity: the age is that of the oldest dated row. A
        -- row dated in the future (a writer's clock ahead, a value set by SQL) counts as age 0: an
        -- age is never negative.
        greatest(COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE isfinite(created_at))), 0), 0)::float8
                                                                                             AS oldest_pending_age_seconds,
        count(*) FILTER (WHERE retry_after IS NOT NULL)                                      AS waiting_for_retry,
        count(*) FILTER (WHERE retry_after IS NOT NULL AND retry_after <= now())             AS due_for_retry,
        -- The skew: pending rows dated after the database's now, and how far ahead the furthest
        -- (dated) one is.
        count(*) FILTER (WHERE created_at > now())                                           AS future_dated,
        COALESCE(EXTRACT(EPOCH FROM max(created_at) FILTER (WHERE isfinite(created_at)
                                                              AND created_at > now()) - now()), 0)::float8
                                                                                             AS max_future_skew_seconds,
        -- The first of them in the queue: the relay's stuck-event gauge ages it from when it first
        -- saw it there.
        min(seq) FILTER (WHERE created_at > now())                                           AS first_future_dated_seq
    FROM outbox_events
    WHERE processed_at IS NULL AND dead_lettered_at IS NULL
)
SELECT queued.*,
       (SELECT count(*)
        FROM outbox_events
        WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL)                         AS dead_letters,
       (SELECT count(*)
        FROM (SELECT DISTINCT aggregate_type, aggregate_id
              FROM outbox_events
              WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL
              LIMIT $1::int8) blocked)                                                       AS blocked_aggregates
FROM queued
