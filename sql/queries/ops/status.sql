-- Operator overview (outbox-relay status). Reads only the pending partial indexes. Every time is
-- compared with the database's own now(), never with a client's clock.
SELECT
    count(*) FILTER (WHERE dead_lettered_at IS NULL)                                         AS pending,
    -- Rows written by raw SQL may hold ±infinity: the age is that of the oldest dated row. A row
    -- dated in the future (a writer's clock ahead, a value set by SQL) counts as age 0: an age is
    -- never negative.
    greatest(COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE dead_lettered_at IS NULL
                                                                           AND isfinite(created_at))), 0), 0)::float8
                                                                                             AS oldest_pending_age_seconds,
    count(*) FILTER (WHERE dead_lettered_at IS NULL AND retry_after IS NOT NULL)             AS waiting_for_retry,
    count(*) FILTER (WHERE dead_lettered_at IS NULL AND retry_after IS NOT NULL AND retry_after <= now())
                                                                                             AS due_for_retry,
    count(*) FILTER (WHERE dead_lettered_at IS NOT NULL)                                     AS dead_letters,
    count(DISTINCT (aggregate_type, aggregate_id)) FILTER (WHERE dead_lettered_at IS NOT NULL)
                                                                                             AS blocked_aggregates,
    -- The skew: pending rows dated after the database's now, and how far ahead the furthest
    -- (dated) one is.
    count(*) FILTER (WHERE dead_lettered_at IS NULL AND created_at > now())                 AS future_dated,
    COALESCE(EXTRACT(EPOCH FROM max(created_at) FILTER (WHERE dead_lettered_at IS NULL
                                                          AND isfinite(created_at)
                                                          AND created_at > now()) - now()), 0)::float8
                                                                                             AS max_future_skew_seconds,
    -- The first of them in the queue: the relay's stuck-event gauge ages it from when it first
    -- saw it there.
    min(seq) FILTER (WHERE dead_lettered_at IS NULL AND created_at > now())                 AS first_future_dated_seq
FROM outbox_events
WHERE processed_at IS NULL
