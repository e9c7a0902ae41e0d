-- Aggregates held behind a dead letter (outbox-relay status): the dead row at their head, why it
-- died and how many events wait behind it, oldest first. $1 limit. Reads the pending indexes only.
SELECT d.aggregate_type, d.aggregate_id, d.id AS event_id, d.event_type, d.last_error,
       d.dead_lettered_at,
       (SELECT count(*) FROM outbox_events w
        WHERE w.processed_at IS NULL
          AND w.aggregate_type = d.aggregate_type
          AND w.aggregate_id = d.aggregate_id
          AND w.seq > d.seq) AS waiting_events
FROM (
    SELECT DISTINCT ON (aggregate_type, aggregate_id)
           id, seq, aggregate_type, aggregate_id, event_type, last_error, dead_lettered_at
    FROM outbox_events
    WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL
    ORDER BY aggregate_type, aggregate_id, seq
) d
ORDER BY d.seq
LIMIT $1
