-- The rest of claim_ordered.sql and claim_ordered_sparse.sql (appended to each): followers of the
-- heads, the prefix of each aggregate that may be published, the byte budget, then the mark.
, followers AS (
    SELECT f.id, f.seq, h.aggregate_type, h.aggregate_id, h.seq AS head_seq, f.eligible, f.size
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT e.id, e.seq,
               e.dead_lettered_at IS NULL AND (e.retry_after IS NULL OR e.retry_after <= now()) AS eligible,
               outbox_row_size(e.payload, e.headers) AS size
        FROM outbox_events e
        WHERE e.processed_at IS NULL
          AND e.aggregate_type = h.aggregate_type
          AND e.aggregate_id = h.aggregate_id
          AND e.seq > h.seq
        ORDER BY e.seq
        -- ceil(($1 - heads) / heads): an equal share of the room left after the heads
        LIMIT (SELECT ($1 - 1) / greatest(count(*), 1) FROM heads)
        FOR UPDATE OF e SKIP LOCKED) f
    LIMIT $1 - (SELECT count(*) FROM heads)
), spans AS MATERIALIZED (
    SELECT aggregate_type, aggregate_id, head_seq, max(seq) AS last_seq, count(*) AS locked
    FROM followers
    GROUP BY aggregate_type, aggregate_id, head_seq
), gaps AS MATERIALIZED (
    -- Computed once (MATERIALIZED: inlined, it would run again for every follower below).
    -- SKIP LOCKED passes over a follower that another session holds (an operator's SELECT ... FOR
    -- UPDATE, a foreign-key check): the rows after it must wait, or they would overtake it. Where
    -- an aggregate has fewer followers locked than pending rows up to its last one, its first
    -- pending row that is not among them is the gap; nothing from there on is published now.
    SELECT s.aggregate_type, s.aggregate_id,
           (SELECT min(o.seq)
            FROM outbox_events o
            WHERE o.processed_at IS NULL
              AND o.aggregate_type = s.aggregate_type
              AND o.aggregate_id = s.aggregate_id
              AND o.seq > s.head_seq AND o.seq < s.last_seq
              AND o.id <> ALL (ARRAY(SELECT f.id FROM followers f
                                     WHERE f.aggregate_type = s.aggregate_type
                                       AND f.aggregate_id = s.aggregate_id))) AS gap_seq
    FROM spans s
    WHERE s.locked < (SELECT count(*)
                      FROM outbox_events o
                      WHERE o.processed_at IS NULL
                        AND o.aggregate_type = s.aggregate_type
                        AND o.aggregate_id = s.aggregate_id
                        AND o.seq > s.head_seq AND o.seq <= s.last_seq)
), claimed AS (
    SELECT id, seq, aggregate_type, aggregate_id, true AS eligible, false AS gap, size FROM heads
    UNION ALL
    SELECT f.id, f.seq, f.aggregate_type, f.aggregate_id, f.eligible,
           coalesce(f.seq >= (SELECT g.gap_seq FROM gaps g
                              WHERE g.aggregate_type = f.aggregate_type
                                AND g.aggregate_id = f.aggregate_id), false),
           f.size
    FROM followers f
), total AS (
    SELECT coalesce(sum(size) FILTER (WHERE eligible AND NOT gap), 0) AS bytes FROM claimed
), plan AS (
    -- Byte budget ($2). Within it (the common case) every eligible row before a gap is published;
    -- over it, rows in seq order while the running total fits, the first row always (a row larger
    -- than the budget goes alone). Each branch runs only when its one-time filter holds, so the
    -- common case pays no sort. Held back by the budget or a gap, a row stays locked but unmarked
    -- until the commit, and its aggregate stops there.
    SELECT c.id, c.seq, c.aggregate_type, c.aggregate_id, c.eligible,
           c.eligible AND NOT c.gap AS publish, false AS over_budget
    FROM claimed c
    WHERE (SELECT bytes FROM total) <= $2
    UNION ALL
    SELECT w.id, w.seq, w.aggregate_type, w.aggregate_id, w.eligible,
           w.eligible AND NOT w.gap AND (w.running <= $2 OR w.n = 1),
           w.eligible AND NOT w.gap AND NOT (w.running <= $2 OR w.n = 1)
    FROM (SELECT c.*,
                 sum(CASE WHEN c.eligible AND NOT c.gap THEN c.size ELSE 0 END)
                     OVER (ORDER BY c.seq ROWS UNBOUNDED PRECEDING) AS running,
                 row_number() OVER (ORDER BY c.seq) AS n
          FROM claimed c) w
    WHERE (SELECT bytes FROM total) > $2
), marked AS (
    -- One primary-key probe per published row (`= ANY(ARRAY(...))`, not a join: with the statistics
    -- of a table that grew since its last analyze the planner may otherwise scan the table once per
    -- row).
    UPDATE outbox_events u
    SET processed_at = now(), retry_after = NULL
    WHERE u.id = ANY(ARRAY(SELECT p.id FROM plan p WHERE p.publish))
    RETURNING u.id, u.seq, u.aggregate_type, u.aggregate_id, u.event_type,
              u.payload::text AS payload, u.headers::text AS headers, u.attempts, u.created_at,
              true AS eligible, false AS held
)
-- The published rows with their content, then the rest of the claim by key only: rows not eligible
-- now (waiting for a retry, dead-lettered) and rows held back (gap, budget; `held`: by the budget). The relay tells heads
-- from followers by seq within the batch, and stops each aggregate at its first row not marked.
SELECT * FROM marked
UNION ALL
SELECT p.id, p.seq, p.aggregate_type, p.aggregate_id, NULL::varchar, NULL::text, NULL::text,
       NULL::int, NULL::timestamptz, false, p.over_budget
FROM plan p
WHERE NOT p.publish
