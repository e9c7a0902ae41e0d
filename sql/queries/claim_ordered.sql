-- Claim and mark, in one statement, up to $1 rows in per-aggregate order, and up to $2 bytes of
-- payload (a single larger row still goes alone). Runs inside the batch's
-- transaction, which commits only after JetStream acknowledged the rows; rows that were not
-- acknowledged are put back (`release.sql`, `record_failures.sql`) before the commit. Until then
-- other relays see the rows as pending (MVCC) and locked (SKIP LOCKED), so they neither claim them
-- nor the later rows of their aggregates.
--
-- heads: pending rows with no older pending row of the same aggregate, found by walking the
-- pending `seq` index; a row that waits for a retry or is dead-lettered is still pending, so it
-- keeps blocking the later rows of its aggregate (that is what keeps per-aggregate order).
-- followers: the later pending rows of the aggregates whose head this statement holds, aggregate
-- by aggregate through the pending aggregate index (no sort), at most an equal share of the room
-- left per aggregate so that one deep aggregate does not crowd out the others. Nobody else can
-- claim them (their head is pending and held here).
WITH heads AS (
    SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id,
           outbox_row_size(e.payload, e.headers) AS size
    FROM outbox_events e
    WHERE e.processed_at IS NULL
      AND e.dead_lettered_at IS NULL
      AND (e.retry_after IS NULL OR e.retry_after <= now())
      -- OFFSET 0 keeps this a per-row probe of the pending aggregate index. As an anti-join, a
      -- plan made while the table was small (prepared statements keep it) scanned the whole
      -- index for every candidate: 13 s per 1,000-row claim with 16 writers filling the table.
      AND NOT EXISTS (
            SELECT 1 FROM outbox_events o
            WHERE o.processed_at IS NULL
              AND o.aggregate_type = e.aggregate_type
              AND o.aggregate_id = e.aggregate_id
              AND o.seq < e.seq
            OFFSET 0)
    ORDER BY e.seq
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
)
-- continues with claim_ordered_rest.sql
