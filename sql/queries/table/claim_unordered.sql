-- --ordering none: claim and mark, in one statement, the oldest claimable rows whatever their
-- aggregate: up to $1 rows and $2 bytes of payload (a single larger row still goes alone). As
-- claim_ordered.sql, this runs inside the batch's transaction, which commits only after the acks;
-- rows that were not acknowledged are put back before the commit.
WITH claimed AS (
    SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id,
           outbox_row_size(e.payload, e.headers) AS size
    FROM outbox_events e
    WHERE e.processed_at IS NULL
      AND outbox_eligible(e.dead_lettered_at, e.retry_after)
    ORDER BY e.seq
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
), total AS (
    SELECT coalesce(sum(size), 0) AS bytes FROM claimed
), plan AS (
    -- Byte budget: see claim_ordered.sql (the common case pays no sort).
    SELECT c.id, c.seq, c.aggregate_type, c.aggregate_id, true AS publish
    FROM claimed c
    WHERE (SELECT bytes FROM total) <= $2
    UNION ALL
    SELECT w.id, w.seq, w.aggregate_type, w.aggregate_id, w.running <= $2 OR w.n = 1
    FROM (SELECT c.*,
                 sum(c.size) OVER (ORDER BY c.seq ROWS UNBOUNDED PRECEDING) AS running,
                 row_number() OVER (ORDER BY c.seq) AS n
          FROM claimed c) w
    WHERE (SELECT bytes FROM total) > $2
), marked AS (
    UPDATE outbox_events u
    SET processed_at = now(), retry_after = NULL
    WHERE u.id = ANY(ARRAY(SELECT p.id FROM plan p WHERE p.publish)) -- primary-key probes, see claim_ordered.sql
    RETURNING u.id, u.seq, u.aggregate_type, u.aggregate_id, u.event_type,
              u.payload::text AS payload, u.headers::text AS headers, u.attempts, u.created_at,
              u.txid::text AS txid,
              true AS eligible, false AS held, NULL::uuid AS prev, NULL::text AS tid,
              false AS alone
)
-- Rows over the byte budget stay locked but unmarked until the commit; the relay claims again.
SELECT * FROM marked
UNION ALL
SELECT p.id, p.seq, p.aggregate_type, p.aggregate_id, NULL::varchar, NULL::text, NULL::text,
       NULL::int, NULL::timestamptz, NULL::text, false, true, NULL::uuid, NULL::text, false
FROM plan p
WHERE NOT p.publish
