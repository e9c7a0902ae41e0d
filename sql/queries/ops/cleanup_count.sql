-- What `cleanup --dry-run` reports: the rows processed (or discarded) more than $1 microseconds
-- ago, by the same cutoff as cleanup.sql.
SELECT count(*) FROM outbox_events
WHERE processed_at IS NOT NULL AND processed_at < now() - $1::int8 * interval '1 microsecond'
