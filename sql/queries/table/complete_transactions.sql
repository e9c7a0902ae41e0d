-- `--transactions atomic`: the rest of each transaction a claim holds events of, so that it goes
-- out whole. $1: the txids (text) of the claim's events, $2: how many events of each the claim
-- holds, $3: the ids of the claim's events (the wal source's claims lock rows without marking
-- them: they still look pending), $4: the most events one atomic batch may hold, $5: whether the
-- claim keeps per-aggregate order, $6: the bytes of each transaction's events the claim holds,
-- $7: the batch's byte budget (`--max-batch-bytes`), which the rest taken must fit in with them.
-- Runs in the claim's transaction, after the claim.
--
-- One answer per transaction with pending rows left (none for one the claim holds whole):
-- * kind `row`: each of its pending rows, locked and marked as a claim marks them, with `blocked`
--   when an older pending row of its aggregate stays outside the batch (it may not go out yet);
-- * `incomplete`: a pending row of it could not be taken (another session holds it, or it waits
--   for its retry): the relay holds the transaction. A dead-lettered row is taken, and retried
--   (attempts from 0, as `dead-letters retry` does): the claim holds a live event of its
--   transaction, which an operator retried;
-- * `split`: more rows left (with those the claim holds) than one atomic batch holds, or more
--   bytes than the batch's budget: none taken, the transaction is published in parts (what each
--   claim holds of it), so that memory stays within the budget whatever the payloads.
--
-- Found through outbox_events_txid_idx only: the pending test is wrapped in coalesce() so that the
-- pending rows' partial indexes stay out of the plan (as in purge_transactions.sql).
WITH given AS (
    SELECT g.txid::xid8 AS txid, g.here, g.here_bytes
    FROM unnest($1::text[], $2::int8[], $6::int8[]) AS g(txid, here, here_bytes)
), counted AS (
    SELECT g.txid, g.here, g.here_bytes, n.pending, n.bytes
    FROM given g
    CROSS JOIN LATERAL (
        SELECT count(*) AS pending, coalesce(sum(r.size), 0) AS bytes
        FROM (SELECT outbox_row_size(o.payload, o.headers) AS size
              FROM outbox_events o
              WHERE o.txid = g.txid AND coalesce(o.processed_at IS NULL, false)
                AND o.id <> ALL ($3::uuid[])
              LIMIT $4 + 1) r) n
), sized AS (
    SELECT c.txid, c.pending,
           c.here + c.pending > $4 OR c.here_bytes + c.bytes > $7 AS too_large
    FROM counted c
), locked AS (
    SELECT e.id, e.txid,
           -- A dead-lettered row is taken too: one event of a dead transaction retried (the one
           -- that failed it, fixed) retries all of it, as `dead-letters retry` would each.
           outbox_eligible(e.dead_lettered_at, e.retry_after) OR e.dead_lettered_at IS NOT NULL
               AS eligible
    FROM outbox_events e
    WHERE e.txid = ANY(ARRAY(SELECT s.txid FROM sized s
                             WHERE s.pending > 0 AND NOT s.too_large))
      AND coalesce(e.processed_at IS NULL, false)
      AND e.id <> ALL ($3::uuid[])
    FOR UPDATE OF e SKIP LOCKED
), verdict AS (
    SELECT s.txid,
           CASE
               WHEN s.too_large THEN 'split'
               WHEN s.pending > (SELECT count(*) FROM locked l
                                 WHERE l.txid = s.txid AND l.eligible) THEN 'incomplete'
               ELSE 'row'
           END AS kind
    FROM sized s
    WHERE s.pending > 0
), taken AS MATERIALIZED (
    SELECT l.id FROM locked l JOIN verdict v ON v.txid = l.txid AND v.kind = 'row'
), marked AS (
    UPDATE outbox_events u
    SET processed_at = now(), retry_after = NULL, dead_lettered_at = NULL,
        attempts = CASE WHEN u.dead_lettered_at IS NULL THEN u.attempts ELSE 0 END
    WHERE u.id = ANY(ARRAY(SELECT t.id FROM taken t))
    RETURNING u.id, u.seq, u.aggregate_type, u.aggregate_id, u.event_type,
              u.payload::text AS payload, u.headers::text AS headers, u.attempts, u.created_at,
              u.txid::text AS txid,
              true AS eligible, false AS held, NULL::uuid AS prev, NULL::text AS tid, false AS alone,
              $5 AND EXISTS (
                  SELECT 1 FROM outbox_events o
                  WHERE o.processed_at IS NULL
                    AND o.aggregate_type = u.aggregate_type
                    AND o.aggregate_id >= u.aggregate_id AND o.aggregate_id <= u.aggregate_id
                    AND o.seq < u.seq
                    AND o.id <> ALL ($3::uuid[])
                    AND o.id <> ALL (ARRAY(SELECT t.id FROM taken t))
                  ORDER BY o.aggregate_id DESC, o.seq DESC
                  OFFSET 0) AS blocked,
              'row' AS kind
)
SELECT * FROM marked
UNION ALL
SELECT NULL::uuid, NULL::int8, NULL::varchar, NULL::varchar, NULL::varchar, NULL::text, NULL::text,
       NULL::int, NULL::timestamptz, v.txid::text, false, false, NULL::uuid, NULL::text, false, false,
       v.kind
FROM verdict v
WHERE v.kind <> 'row'
