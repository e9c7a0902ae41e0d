-- --source wal, the stream's fallback: of the rows seen pending by stranded_scan.sql ($1), those
-- still pending and publishable, with their aggregates (handed to the table with defer.sql).
SELECT e.id, e.aggregate_type, e.aggregate_id
FROM outbox_events e
WHERE e.id = ANY($1::uuid[])
  AND e.processed_at IS NULL
  AND outbox_eligible(e.dead_lettered_at, e.retry_after)
