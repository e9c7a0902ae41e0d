-- --source wal, the stream's fallback (every --fallback-interval): up to $1 aggregates with a pending
-- row, from ($2, $3) on in (aggregate_type, aggregate_id) order (the relay goes round from where
-- the last look stopped), each with its oldest pending row when that row may be published now and
-- the aggregate is not handed to the table (`candidate`), and the server's WAL insert position
-- after this statement's snapshot was taken (`lsn`): every row seen here committed before it.
-- Once the slot has confirmed past that position, each such row must have been resolved by the
-- stream (published, or its aggregate handed to the table); one still pending then was in no
-- stream (stranded_check.sql). A stranded row is its aggregate's oldest pending one, or becomes
-- it once the older ones go out. A skip scan of the pending aggregate index: one probe per
-- aggregate, at most $1 of them, however many rows are pending. Run with the relay's planner
-- settings (begin_claim.sql), so that no plan made on a new table walks the table per probe.
WITH RECURSIVE heads AS (
    (SELECT o.aggregate_type, o.aggregate_id
     FROM outbox_events o
     WHERE o.processed_at IS NULL
       AND (o.aggregate_type, o.aggregate_id) >= ($2::text, $3::text)
     ORDER BY o.aggregate_type, o.aggregate_id, o.seq
     LIMIT 1)
    UNION ALL
    SELECT n.aggregate_type, n.aggregate_id
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT o.aggregate_type, o.aggregate_id
        FROM outbox_events o
        WHERE o.processed_at IS NULL
          AND (o.aggregate_type, o.aggregate_id) > (h.aggregate_type, h.aggregate_id)
        ORDER BY o.aggregate_type, o.aggregate_id, o.seq
        LIMIT 1
    ) n
)
SELECT pg_current_wal_insert_lsn() AS lsn, h.aggregate_type, h.aggregate_id, e.id,
       outbox_eligible(e.dead_lettered_at, e.retry_after)
         AND NOT EXISTS (SELECT FROM outbox_wal_deferred d
                         WHERE d.aggregate_type = h.aggregate_type
                           AND d.aggregate_id = h.aggregate_id) AS candidate
FROM (SELECT * FROM heads LIMIT $1) h
CROSS JOIN LATERAL (
    SELECT o.id, o.dead_lettered_at, o.retry_after
    FROM outbox_events o
    WHERE o.processed_at IS NULL
      AND o.aggregate_type = h.aggregate_type
      AND o.aggregate_id >= h.aggregate_id AND o.aggregate_id <= h.aggregate_id
    ORDER BY o.aggregate_id, o.seq
    LIMIT 1
) e
