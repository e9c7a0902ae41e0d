-- What `cleanup --processed-events-older-than --dry-run` reports: the processed_events rows
-- recorded more than $1 microseconds ago, by the same cutoff as cleanup_processed_events.sql.
SELECT count(*) FROM processed_events
WHERE processed_at < now() - $1::int8 * interval '1 microsecond'
