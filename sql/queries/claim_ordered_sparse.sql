-- claim_ordered.sql for a backlog of few aggregates with many rows each. There, walking the
-- pending `seq` index for heads visits every pending row (most have an older pending row of their
-- aggregate), which costs seconds at 100k pending. This variant hops from one pending aggregate to
-- the next through the pending aggregate index instead (a loose index scan: one index descent per
-- aggregate), takes each aggregate's oldest pending row as its head candidate, and then proceeds as
-- claim_ordered.sql. Heads come in aggregate order here, not seq order (sorting would make the
-- planner walk the seq index again). The relay uses this variant only after a full claim that
-- found fewer heads than the batch size (so every aggregate gets its head into each batch anyway),
-- and goes back to the walk as soon as a claim is not full or fills up with heads.
WITH RECURSIVE aggregates AS (
    (SELECT e.aggregate_type, e.aggregate_id
     FROM outbox_events e
     WHERE e.processed_at IS NULL
     ORDER BY e.aggregate_type, e.aggregate_id
     LIMIT 1)
    UNION ALL
    SELECT n.aggregate_type, n.aggregate_id
    FROM aggregates a
    CROSS JOIN LATERAL (
        SELECT e.aggregate_type, e.aggregate_id
        FROM outbox_events e
        WHERE e.processed_at IS NULL
          AND (e.aggregate_type, e.aggregate_id) > (a.aggregate_type, a.aggregate_id)
        ORDER BY e.aggregate_type, e.aggregate_id
        LIMIT 1) n
), candidates AS (
    SELECT c.id
    FROM aggregates a
    CROSS JOIN LATERAL (
        SELECT e.id
        FROM outbox_events e
        WHERE e.processed_at IS NULL
          AND e.aggregate_type = a.aggregate_type
          AND e.aggregate_id = a.aggregate_id
        ORDER BY e.seq
        LIMIT 1) c
), heads AS (
    -- One primary-key probe per candidate, whatever the statistics say: `= ANY(ARRAY(...))`
    -- rather than a join, and the pending test wrapped in coalesce() so that it does not match
    -- the pending indexes' predicate (else the planner may scan every pending row against the
    -- candidates). At most $1 candidates are looked at per claim.
    SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id
    FROM outbox_events e
    WHERE e.id = ANY(ARRAY(SELECT c.id FROM candidates c LIMIT $1))
      AND coalesce(e.processed_at IS NULL, false)
      AND e.dead_lettered_at IS NULL
      AND (e.retry_after IS NULL OR e.retry_after <= now())
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
)
-- continues with claim_ordered_rest.sql
