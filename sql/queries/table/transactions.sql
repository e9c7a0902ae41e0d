-- Where the events about to be published stand in the transactions that wrote them. One row of
-- parameters per transaction the batch holds events of: $1 txid (text), $2 and $3 the batch's
-- lowest and highest seq of it, $4 how many of its events the batch holds, and, from an earlier
-- batch that published part of it: $5 a seq of it and $6 that row's place, $7 its count (NULL:
-- none). Runs in the claim's transaction.
--
-- A transaction's count is read from the table (outbox_events_txid_idx, (txid, seq)), which holds
-- every row of a transaction until all of them are published (the table source marks published
-- rows; the wal source, which deletes them, keeps those of a transaction it publishes over several
-- batches, marked, or for a run of consecutive seqs its first seq and count in
-- outbox_transaction_runs). Three answers, each one row per transaction unless said:
-- * `whole`: the batch holds all its events (one probe for a one-event transaction): the relay
--   numbers them within the batch.
-- * `run`: its rows are consecutive seqs (no other transaction wrote between its first and last
--   row, as a bulk INSERT): `first` is its first seq, an event's place is `seq - first + 1`.
-- * otherwise its rows from the batch's lowest to highest seq, numbered (`seq`, `position`: one row
--   each), after counting those before them, from the row learnt earlier when there is one.
WITH given AS (
    SELECT g.txid::xid8 AS txid, g.lo, g.hi, g.in_batch, g.anchor, g.anchor_position, g.events
    FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::int8[],
                $7::int8[]) AS g(txid, lo, hi, in_batch, anchor, anchor_position, events)
), kept AS (
    -- Runs the wal source published part of and deleted (outbox_transaction_runs).
    SELECT g.txid, r.first_seq, r.events
    FROM given g
    JOIN outbox_transaction_runs r ON r.txid = g.txid
), t AS (
    SELECT g.txid, g.lo, g.hi, g.in_batch, g.anchor, g.anchor_position,
           coalesce(g.events,
                    (SELECT count(*) FROM outbox_events o WHERE o.txid = g.txid)) AS events
    FROM given g
    WHERE NOT EXISTS (SELECT FROM kept k WHERE k.txid = g.txid)
), part AS (
    SELECT t.*,
           (SELECT o.seq FROM outbox_events o WHERE o.txid = t.txid
            ORDER BY o.txid, o.seq LIMIT 1) AS first,
           (SELECT o.seq FROM outbox_events o WHERE o.txid = t.txid
            ORDER BY o.txid DESC, o.seq DESC LIMIT 1) AS last
    FROM t
    WHERE t.events <> t.in_batch
), spread AS (
    SELECT p.txid, p.lo, p.hi, p.events,
           CASE
               WHEN p.anchor IS NULL THEN
                   (SELECT count(*) FROM outbox_events o WHERE o.txid = p.txid AND o.seq < p.lo)
               WHEN p.anchor < p.lo THEN
                   p.anchor_position
                   + (SELECT count(*) FROM outbox_events o
                      WHERE o.txid = p.txid AND o.seq > p.anchor AND o.seq < p.lo)
               ELSE
                   p.anchor_position
                   - (SELECT count(*) FROM outbox_events o
                      WHERE o.txid = p.txid AND o.seq >= p.lo AND o.seq <= p.anchor)
           END AS before
    FROM part p
    WHERE p.last - p.first + 1 <> p.events
)
SELECT t.txid::text AS txid, 'whole' AS kind, NULL::int8 AS seq, NULL::int8 AS position,
       t.events, NULL::int8 AS first
FROM t
WHERE t.events = t.in_batch
UNION ALL
SELECT p.txid::text, 'run', NULL, NULL, p.events, p.first
FROM part p
WHERE p.last - p.first + 1 = p.events
UNION ALL
SELECT k.txid::text, 'run', NULL, NULL, k.events, k.first_seq
FROM kept k
UNION ALL
SELECT s.txid::text, 'spread', o.seq,
       s.before + row_number() OVER (PARTITION BY s.txid ORDER BY o.seq), s.events, NULL
FROM spread s
JOIN outbox_events o ON o.txid = s.txid AND o.seq >= s.lo AND o.seq <= s.hi
