-- How many dead letters match the filter $1..$8 (dead_letter_filter.sql), counted up to $9: the
-- list shows the total, and more than $9 as "$9+", so that the page stays fast on a million
-- (a bulk action counts them all, with dead_letters_count.sql, before it asks to confirm).
SELECT count(*) AS total
FROM (
    SELECT 1
    FROM outbox_events
    WHERE /* dead_letter_filter.sql */
    LIMIT $9::int8
) AS matching
