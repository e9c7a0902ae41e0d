-- What `cleanup --processed-events-older-than --dry-run` reports: the processed_events rows
-- recorded before $1, which the cleanup with the same cutoff would delete.
SELECT count(*) FROM processed_events
WHERE processed_at < $1
