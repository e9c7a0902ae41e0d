-- claim_ordered.sql for a backlog of few aggregates with many rows each. There, walking the
-- pending `seq` index for heads visits every pending row (most have an older pending row of their
-- aggregate), which costs seconds at 100k pending. This variant hops from one pending aggregate to
-- the next through the pending aggregate index instead (a loose index scan: one index descent per
-- aggregate) and takes each aggregate's oldest pending row as its head candidate, then proceeds as
-- claim_ordered.sql. Heads come in aggregate order here, not seq order (sorting would make the
-- planner walk the seq index again). The relay uses this variant only after a full claim that
-- found fewer heads than the batch size (so every aggregate gets its head into each batch anyway),
-- and goes back to the walk as soon as a claim is not full or fills up with heads.
-- The hop reads the pending aggregate index, ordered (aggregate_type, aggregate_id, seq), so the first
-- entry past the previous aggregate is the next aggregate's oldest pending row: its head candidate.
-- A candidate that is not eligible (dead-lettered, or waiting for its retry) blocks its aggregate;
-- the hop goes on past it, so blocked aggregates never use up the room of a batch.
WITH RECURSIVE candidates AS (
    (SELECT e.id, e.aggregate_type, e.aggregate_id,
            e.dead_lettered_at IS NULL AND (e.retry_after IS NULL OR e.retry_after <= now()) AS eligible
     FROM outbox_events e
     WHERE e.processed_at IS NULL
     ORDER BY e.aggregate_type, e.aggregate_id, e.seq
     LIMIT 1)
    UNION ALL
    SELECT n.id, n.aggregate_type, n.aggregate_id, n.eligible
    FROM candidates c
    CROSS JOIN LATERAL (
        SELECT e.id, e.aggregate_type, e.aggregate_id,
               e.dead_lettered_at IS NULL AND (e.retry_after IS NULL OR e.retry_after <= now()) AS eligible
        FROM outbox_events e
        WHERE e.processed_at IS NULL
          AND (e.aggregate_type, e.aggregate_id) > (c.aggregate_type, c.aggregate_id)
        ORDER BY e.aggregate_type, e.aggregate_id, e.seq
        LIMIT 1) n
), heads AS (
    -- One primary-key probe per candidate, whatever the statistics say: `= ANY(ARRAY(...))`
    -- rather than a join, and the pending test wrapped in coalesce() so that it does not match
    -- the pending indexes' predicate (else the planner may scan every pending row against the
    -- candidates). At most $1 eligible candidates are looked at per claim.
    SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id,
           outbox_row_size(e.payload, e.headers) AS size
    FROM outbox_events e
    WHERE e.id = ANY(ARRAY(SELECT c.id FROM candidates c WHERE c.eligible LIMIT $1))
      AND coalesce(e.processed_at IS NULL, false)
      AND e.dead_lettered_at IS NULL
      AND (e.retry_after IS NULL OR e.retry_after <= now())
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
)
-- continues with claim_ordered_rest.sql
