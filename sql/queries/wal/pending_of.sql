-- --source wal: the pending rows of aggregates handed to the table ($1 types, $2 ids), oldest
-- first, at most $3 per aggregate (one more than the relay takes, so that it can tell whether it
-- saw them all): their keys, whether they may be published now, their size for the byte budget
-- and when the first one waiting for a retry is due. Reads the pending aggregate index only.
SELECT e.id, a.aggregate_type, a.aggregate_id,
       outbox_eligible(e.dead_lettered_at, e.retry_after) AS eligible,
       e.dead_lettered_at IS NOT NULL AS dead,
       EXTRACT(EPOCH FROM e.retry_after - now())::float8 AS due_in_seconds,
       outbox_row_size(e.payload, e.headers) AS size
FROM unnest($1::text[], $2::text[]) AS a(aggregate_type, aggregate_id)
CROSS JOIN LATERAL (
    SELECT o.id, o.seq, o.dead_lettered_at, o.retry_after, o.payload, o.headers
    FROM outbox_events o
    WHERE o.processed_at IS NULL
      AND o.aggregate_type = a.aggregate_type
      -- A one-value range, in (aggregate_id, seq) order: only the pending aggregate index gives
      -- that order without a sort (and the relay's settings rule sorts out). By equality, the
      -- pending seq index gives `ORDER BY seq` too, and a plan made on an empty table took it,
      -- walking every pending row for each aggregate. Plans are made once per connection.
      AND o.aggregate_id >= a.aggregate_id AND o.aggregate_id <= a.aggregate_id
    ORDER BY o.aggregate_id, o.seq
    LIMIT $3
) e
ORDER BY a.aggregate_type, a.aggregate_id, e.seq
