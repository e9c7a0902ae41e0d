-- The console's dead letters grouped by cause (error_cause.sql), most frequent first, at most $10
-- causes: how many, first and last dead-lettered, among at most $9 dead letters matching the
-- filter $1..$8 (dead_letter_filter.sql) and how many that was (`looked_at`: below $9, every
-- match). The bound keeps the page fast with a million dead letters: the cause is a few regular
-- expressions per row.
WITH matching AS (
    SELECT last_error, dead_lettered_at
    FROM outbox_events
    WHERE /* dead_letter_filter.sql */
    LIMIT $9::int8
)
SELECT error_cause(last_error) AS cause, count(*) AS dead_letters,
       min(dead_lettered_at) AS first_seen, max(dead_lettered_at) AS last_seen,
       (SELECT count(*) FROM matching) AS looked_at
FROM matching
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT $10::int8
