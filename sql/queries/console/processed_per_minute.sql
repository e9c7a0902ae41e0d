-- Events published and events dead-lettered in each of the last 60 minutes by the database's clock
-- (0: the current minute), discarded dead letters not counted as published, dead letters retried
-- since no longer counted. Rows a relay deletes (--wal-marking delete) or a retention already
-- removed are not here to count. Reads the published rows (no index of them: every publish would
-- pay its entry) and the dead letters (their index, 0007); counts per minute first, so that only
-- the minutes, not the rows, are turned into minutes ago.
SELECT (EXTRACT(EPOCH FROM date_trunc('minute', now()) - minute) / 60)::int AS minutes_ago,
       sum(published)::int8 AS published, sum(dead_lettered)::int8 AS dead_lettered
FROM (SELECT date_trunc('minute', processed_at) AS minute, count(*) AS published,
             0 AS dead_lettered
      FROM outbox_events
      WHERE processed_at >= date_trunc('minute', now()) - interval '59 minutes'
        AND processed_at IS NOT NULL AND discarded_at IS NULL
      GROUP BY 1
      UNION ALL
      SELECT date_trunc('minute', dead_lettered_at), 0, count(*)
      FROM outbox_events
      WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL
        AND dead_lettered_at >= date_trunc('minute', now()) - interval '59 minutes'
      GROUP BY 1) per_minute
GROUP BY 1
