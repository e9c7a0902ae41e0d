-- What a bulk action of the console would touch: the dead letters matching the filter $1..$8
-- (dead_letter_filter.sql), and the highest seq among them, which bounds the action to the rows
-- counted here (a row dead-lettered after the operator confirmed is not included).
SELECT count(*) AS matching, max(seq) AS upto
FROM outbox_events
WHERE /* dead_letter_filter.sql */
