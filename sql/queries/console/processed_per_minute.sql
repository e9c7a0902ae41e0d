-- Events published in each of the last 60 minutes by the database's clock (0: the current
-- minute), discarded dead letters not counted. Rows a relay deletes (--wal-marking delete) or a
-- retention already removed are not here to count.
SELECT (EXTRACT(EPOCH FROM date_trunc('minute', now()) - date_trunc('minute', processed_at)) / 60)::int AS minutes_ago,
       count(*) AS published
FROM outbox_events
WHERE processed_at >= date_trunc('minute', now()) - interval '59 minutes'
  AND discarded_at IS NULL
GROUP BY 1
