-- What `cleanup --dry-run` reports: the rows processed (or discarded) before $1, which cleanup
-- with the same cutoff would delete.
SELECT count(*) FROM outbox_events
WHERE processed_at IS NOT NULL AND processed_at < $1
