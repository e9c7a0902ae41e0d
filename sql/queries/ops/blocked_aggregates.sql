-- Aggregates held behind a dead letter (outbox-relay status, the console): the dead row at their
-- head, why it died and how many events wait behind it, oldest first. $1 limit.
--
-- The dead letters in seq order, each kept when no older dead letter of its aggregate exists (a
-- probe of the dead-letter index of version 7, or of the pending aggregate index without it): the
-- walk stops after $1 heads instead of sorting every dead letter first.
SELECT d.aggregate_type, d.aggregate_id, d.id AS event_id, d.event_type, d.last_error,
       d.dead_lettered_at,
       (SELECT count(*) FROM outbox_events w
        WHERE w.processed_at IS NULL
          AND w.aggregate_type = d.aggregate_type
          AND w.aggregate_id = d.aggregate_id
          AND w.seq > d.seq) AS waiting_events
FROM outbox_events d
WHERE d.processed_at IS NULL AND d.dead_lettered_at IS NOT NULL
  AND NOT EXISTS (SELECT FROM outbox_events o
                  WHERE o.processed_at IS NULL AND o.dead_lettered_at IS NOT NULL
                    AND o.aggregate_type = d.aggregate_type
                    AND o.aggregate_id = d.aggregate_id
                    AND o.seq < d.seq)
ORDER BY d.seq
LIMIT $1::int8
