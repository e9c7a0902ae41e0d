-- The first claim after a writer's notification at idle, in per-aggregate order: up to $1 heads
-- (pending rows with no older pending row of their aggregate) and up to $2 bytes of payload (the
-- first head always, as claim_ordered.sql does), claimed and marked in one statement. The full
-- claim (claim_ordered.sql) also finds followers, gaps and hops; that plan is four times the
-- nodes, and a notification usually brings one event: this one costs PostgreSQL about half as much per call
-- (measured 0.20 against 0.39 ms for one row), which is most of what the claim adds to an idle
-- event's latency. The relay claims again at once with the full claim (the heads' followers, or
-- anything that came meanwhile), so nothing waits behind it.
--
-- The walk, the older-row probe and the mark are those of claim_ordered.sql, for the same reasons
-- (see there: a one-value range in descending order keeps the probe on the pending aggregate
-- index whatever the table held when the plan was made; `= ANY(ARRAY(...))` keeps the mark one
-- primary-key probe per row). Same output: the marked rows with their content, then the rows
-- held back by the byte budget by key only. Unlike the full claim it also says which rows their
-- transaction wrote alone (`alone`): at idle that is most events, and each then goes to the broker
-- without the round trip of transactions.sql.
WITH heads AS (
    SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id,
           outbox_row_size(e.payload, e.headers) AS size
    FROM outbox_events e
    WHERE e.processed_at IS NULL
      AND outbox_eligible(e.dead_lettered_at, e.retry_after)
      AND NOT EXISTS (
            SELECT 1 FROM outbox_events o
            WHERE o.processed_at IS NULL
              AND o.aggregate_type = e.aggregate_type
              AND o.aggregate_id >= e.aggregate_id AND o.aggregate_id <= e.aggregate_id
              AND o.seq < e.seq
            ORDER BY o.aggregate_id DESC, o.seq DESC
            OFFSET 0)
    ORDER BY e.seq
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
), plan AS (
    SELECT h.id, h.seq, h.aggregate_type, h.aggregate_id,
           sum(h.size) OVER w <= $2 OR row_number() OVER w = 1 AS publish
    FROM heads h
    WINDOW w AS (ORDER BY h.seq ROWS UNBOUNDED PRECEDING)
), marked AS (
    UPDATE outbox_events u
    SET processed_at = now(), retry_after = NULL
    WHERE u.id = ANY(ARRAY(SELECT p.id FROM plan p WHERE p.publish))
    RETURNING u.id, u.seq, u.aggregate_type, u.aggregate_id, u.event_type,
              u.payload::text AS payload, u.headers::text AS headers, u.attempts, u.created_at,
              u.txid::text AS txid,
              true AS eligible, false AS held, NULL::uuid AS prev, NULL::text AS tid,
              -- The transaction wrote this row alone (no other row of it in the table, none of
              -- it published and deleted before: outbox_transaction_runs): its place is known
              -- without transactions.sql. Two probes, bounded whatever the transaction's size.
              u.txid IS NOT NULL
              AND (SELECT count(*) FROM (SELECT FROM outbox_events o WHERE o.txid = u.txid
                                         LIMIT 2) t) = 1
              AND NOT EXISTS (SELECT FROM outbox_transaction_runs r WHERE r.txid = u.txid)
                  AS alone
)
SELECT * FROM marked
UNION ALL
SELECT p.id, p.seq, p.aggregate_type, p.aggregate_id, NULL::varchar, NULL::text, NULL::text,
       NULL::int, NULL::timestamptz, NULL::text, false, true, NULL::uuid, NULL::text, false
FROM plan p
WHERE NOT p.publish
