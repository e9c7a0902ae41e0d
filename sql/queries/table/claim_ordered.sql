-- Claim and mark, in one statement, up to $1 rows in per-aggregate order, and up to $2 bytes of
-- payload (a single larger row still goes alone). Runs inside the batch's
-- transaction, which commits only after JetStream acknowledged the rows; rows that were not
-- acknowledged are put back (`release.sql`, `record_failures.sql`) before the commit. Until then
-- other relays see the rows as pending (MVCC) and locked (SKIP LOCKED), so they neither claim them
-- nor the later rows of their aggregates.
--
-- heads: pending rows with no older pending row of the same aggregate. A row that waits for a retry
-- or is dead-lettered is still pending, so it keeps blocking the later rows of its aggregate (that
-- is what keeps per-aggregate order). Two ways to find them, chosen by $3 (each is a one-time
-- filter of the generic plan, so the other costs nothing):
-- * walked ($3 false): walk the pending `seq` index, in seq order.
-- * hopped ($3 true): for a backlog of few aggregates with many rows each. There, the walk visits
--   every pending row (most have an older pending row of their aggregate), which costs seconds at
--   100k pending. The hop goes from one pending aggregate to the next through the pending
--   aggregate index (`candidates`, a loose index scan: one index descent per aggregate) and takes
--   each aggregate's oldest pending row as its head candidate. Heads come in aggregate order here,
--   not seq order (sorting would make the planner walk the seq index again). The relay hops only
--   after a full claim that found fewer heads than the batch size (so every aggregate gets its
--   head into each batch anyway), and walks again as soon as a claim is not full or fills up with
--   heads.
-- followers: the later pending rows of the aggregates whose head this statement holds, aggregate
-- by aggregate through the pending aggregate index (no sort), at most an equal share of the room
-- left per aggregate so that one deep aggregate does not crowd out the others. Nobody else can
-- claim them (their head is pending and held here).
-- Then the prefix of each aggregate that may be published, the byte budget, and the mark.
WITH RECURSIVE candidates AS (
    -- The pending aggregate index is ordered (aggregate_type, aggregate_id, seq), so the first
    -- entry past the previous aggregate is the next aggregate's oldest pending row: its head
    -- candidate. A candidate that is not eligible (dead-lettered, or waiting for its retry) blocks
    -- its aggregate; the hop goes on past it, so blocked aggregates never use up the room of a
    -- batch.
    (SELECT e.id, e.aggregate_type, e.aggregate_id,
            outbox_eligible(e.dead_lettered_at, e.retry_after) AS eligible
     FROM outbox_events e
     WHERE $3 AND e.processed_at IS NULL
     ORDER BY e.aggregate_type, e.aggregate_id, e.seq
     LIMIT 1)
    UNION ALL
    SELECT n.id, n.aggregate_type, n.aggregate_id, n.eligible
    FROM candidates c
    CROSS JOIN LATERAL (
        SELECT e.id, e.aggregate_type, e.aggregate_id,
               outbox_eligible(e.dead_lettered_at, e.retry_after) AS eligible
        FROM outbox_events e
        WHERE e.processed_at IS NULL
          AND (e.aggregate_type, e.aggregate_id) > (c.aggregate_type, c.aggregate_id)
        ORDER BY e.aggregate_type, e.aggregate_id, e.seq
        LIMIT 1) n
), walked AS (
    SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id,
           outbox_row_size(e.payload, e.headers) AS size
    FROM outbox_events e
    WHERE NOT $3
      AND e.processed_at IS NULL
      AND outbox_eligible(e.dead_lettered_at, e.retry_after)
      -- OFFSET 0 keeps this a per-row probe of the pending aggregate index. As an anti-join, a
      -- plan made while the table was small (prepared statements keep it) scanned the whole
      -- index for every candidate: 13 s per 1,000-row claim with 16 writers filling the table.
      -- The aggregate's id as a one-value range, in (aggregate_id, seq) order: only the pending
      -- aggregate index gives that without a sort (this transaction's settings rule sorts out).
      -- By equality, a plan made on an empty table probed the pending seq index instead and
      -- walked every older pending row for each candidate. The same goes for every lookup of one
      -- aggregate's rows below. Backward (DESC): the scan starts at the nearest older entry and
      -- ends at the first one of another aggregate; forward, with the aggregate as a range,
      -- `seq < e.seq` does not end the scan, which then walked the candidate's later rows too.
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
), hopped AS (
    -- One primary-key probe per candidate, whatever the statistics say: `= ANY(ARRAY(...))`
    -- rather than a join, and the pending test wrapped in coalesce() so that it does not match
    -- the pending indexes' predicate (else the planner may scan every pending row against the
    -- candidates). At most $1 eligible candidates are looked at per claim.
    SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id,
           outbox_row_size(e.payload, e.headers) AS size
    FROM outbox_events e
    WHERE $3
      AND e.id = ANY(ARRAY(SELECT c.id FROM candidates c WHERE c.eligible LIMIT $1))
      AND coalesce(e.processed_at IS NULL, false)
      AND outbox_eligible(e.dead_lettered_at, e.retry_after)
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
), heads AS (
    SELECT * FROM walked
    UNION ALL
    SELECT * FROM hopped
)
, followers AS (
    SELECT f.id, f.seq, h.aggregate_type, h.aggregate_id, h.seq AS head_seq, f.eligible, f.size
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT e.id, e.seq,
               outbox_eligible(e.dead_lettered_at, e.retry_after) AS eligible,
               outbox_row_size(e.payload, e.headers) AS size
        FROM outbox_events e
        WHERE e.processed_at IS NULL
          AND e.aggregate_type = h.aggregate_type
          AND e.aggregate_id >= h.aggregate_id AND e.aggregate_id <= h.aggregate_id
          AND e.seq > h.seq
        ORDER BY e.aggregate_id, e.seq
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
           (SELECT o.seq
            FROM outbox_events o
            WHERE o.processed_at IS NULL
              AND o.aggregate_type = s.aggregate_type
              AND o.aggregate_id >= s.aggregate_id AND o.aggregate_id <= s.aggregate_id
              AND o.seq > s.head_seq AND o.seq < s.last_seq
              AND o.id <> ALL (ARRAY(SELECT f.id FROM followers f
                                     WHERE f.aggregate_type = s.aggregate_type
                                       AND f.aggregate_id = s.aggregate_id))
            ORDER BY o.aggregate_id, o.seq
            LIMIT 1) AS gap_seq
    FROM spans s
    -- The count scans backward from the last follower (forward from the head it would go on
    -- to the aggregate's last pending row: with the aggregate as a range, `seq` does not end it).
    WHERE s.locked < (SELECT count(*)
                      FROM (SELECT 1
                            FROM outbox_events o
                            WHERE o.processed_at IS NULL
                              AND o.aggregate_type = s.aggregate_type
                              AND o.aggregate_id >= s.aggregate_id
                              AND o.aggregate_id <= s.aggregate_id
                              AND o.seq > s.head_seq AND o.seq <= s.last_seq
                            ORDER BY o.aggregate_id DESC, o.seq DESC
                            OFFSET 0) n)
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
              u.txid::text AS txid,
              true AS eligible, false AS held, NULL::uuid AS prev, NULL::text AS tid,
              false AS alone
)
-- The published rows with their content, then the rest of the claim by key only: rows not eligible
-- now (waiting for a retry, dead-lettered) and rows held back (gap, budget; `held`: by the budget). The relay tells heads
-- from followers by seq within the batch, and stops each aggregate at its first row not marked.
SELECT * FROM marked
UNION ALL
SELECT p.id, p.seq, p.aggregate_type, p.aggregate_id, NULL::varchar, NULL::text, NULL::text,
       NULL::int, NULL::timestamptz, NULL::text, false, p.over_budget, NULL::uuid, NULL::text, false
FROM plan p
WHERE NOT p.publish
