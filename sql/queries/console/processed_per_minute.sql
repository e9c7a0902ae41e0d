-- Events published in each of the last 60 minutes by the database's clock (0: the current
-- minute), discarded dead letters not counted. Rows a relay deletes (--wal-marking delete) or a
-- retention already removed are not here to count. Reads the published rows (no index of them:
-- every publish would pay its entry); counts per minute first, so that only the minutes, not the
-- rows, are turned into minutes ago.
SELECT (EXTRACT(EPOCH FROM date_trunc('minute', now()) - minute) / 60)::int AS minutes_ago,
       published
FROM (SELECT date_trunc('minute', processed_at) AS minute, count(*) AS published
      FROM outbox_events
      WHERE processed_at >= date_trunc('minute', now()) - interval '59 minutes'
        AND processed_at IS NOT NULL AND discarded_at IS NULL
      GROUP BY 1) per_minute
