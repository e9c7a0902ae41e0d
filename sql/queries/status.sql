-- Operator overview (outbox-relay status). Reads only the pending partial indexes.
SELECT
    count(*) FILTER (WHERE dead_lettered_at IS NULL)                                         AS pending,
    -- Rows written by raw SQL may hold ±infinity: the age is that of the oldest dated row.
    COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE dead_lettered_at IS NULL
                                                                  AND isfinite(created_at))), 0)::float8
                                                                                             AS oldest_pending_age_seconds,
    count(*) FILTER (WHERE dead_lettered_at IS NULL AND retry_after IS NOT NULL)             AS waiting_for_retry,
    count(*) FILTER (WHERE dead_lettered_at IS NULL AND retry_after IS NOT NULL AND retry_after <= now())
                                                                                             AS due_for_retry,
    count(*) FILTER (WHERE dead_lettered_at IS NOT NULL)                                     AS dead_letters,
    count(DISTINCT (aggregate_type, aggregate_id)) FILTER (WHERE dead_lettered_at IS NOT NULL)
                                                                                             AS blocked_aggregates
FROM outbox_events
WHERE processed_at IS NULL
