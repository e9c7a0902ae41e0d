-- --source wal: claim and mark, in one statement, the rows with these ids ($1, in the order the
-- relay will publish them) that are pending and eligible, skipping rows another session holds.
-- Like claim_ordered.sql it runs inside the batch's transaction, which commits only after
-- JetStream acknowledged the rows; rows not acknowledged are put back before the commit. The ids
-- come from the replication stream (committed inserts, in commit order) or from the table
-- (aggregates handed to the table, in seq order): no walk over the pending rows, one primary-key
-- probe per id (`= ANY(ARRAY(...))`, and the pending test wrapped in coalesce() so that the
-- planner does not take the pending indexes for it). A row missing from the result was published
-- already (a replay), deleted, held by another session or not eligible (`row_states.sql` tells).
-- The RETURNING list's subquery sees the table as the statement began (the rows it marks still
-- pending there), as lock_ids.sql sees its own locked rows.
-- `prev`: the row's nearest older pending row of its aggregate (NULL: none), one backward probe of
-- the pending aggregate index (a one-value range of aggregate_id in descending (aggregate_id, seq)
-- order, which only that index gives without a sort). The relay publishes a streamed row only when
-- that row is one it knows (streamed, in flight, or resolved a moment ago); otherwise the table
-- holds an older event of the aggregate that no stream carried (skipped, or left by an earlier
-- relay) and the aggregate goes to the table, which publishes in seq order.
WITH locked AS (
    SELECT e.id
    FROM outbox_events e
    WHERE e.id = ANY($1::uuid[])
      AND coalesce(e.processed_at IS NULL, false)
      AND outbox_eligible(e.dead_lettered_at, e.retry_after)
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE outbox_events u
SET processed_at = now(), retry_after = NULL
WHERE u.id = ANY(ARRAY(SELECT l.id FROM locked l))
RETURNING u.id, u.seq, u.aggregate_type, u.aggregate_id, u.event_type,
          u.payload::text AS payload, u.headers::text AS headers, u.attempts, u.created_at,
          u.txid::text AS txid,
          true AS eligible, false AS held,
          (SELECT o.id FROM outbox_events o
                WHERE o.processed_at IS NULL
                  AND o.aggregate_type = u.aggregate_type
                  AND o.aggregate_id >= u.aggregate_id AND o.aggregate_id <= u.aggregate_id
                  AND o.seq < u.seq
                ORDER BY o.aggregate_id DESC, o.seq DESC
                LIMIT 1) AS prev,
          NULL::text AS tid,
          false AS alone
