-- --source wal: claim and mark, in one statement, the rows with these ids ($1, in the order the
-- relay will publish them) that are pending and eligible, skipping rows another session holds.
-- Like claim_ordered.sql it runs inside the batch's transaction, which commits only after
-- JetStream acknowledged the rows; rows not acknowledged are put back before the commit. The ids
-- come from the replication stream (committed inserts, in commit order) or from the table
-- (aggregates handed to the table, in seq order): no walk over the pending rows, one primary-key
-- probe per id (`= ANY(ARRAY(...))`, and the pending test wrapped in coalesce() so that the
-- planner does not take the pending indexes for it). A row missing from the result was published
-- already (a replay), deleted, held by another session or not eligible (`row_states.sql` tells).
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
          true AS eligible, false AS held
