-- --source wal: what became of streamed rows that the claim did not take. $1 the ids, $2 the
-- 32-bit id of the transaction that wrote each (from the stream; 0: read from the table, so
-- visible). Per row: `found`; `pending` (still to publish: held by another session, waiting for a
-- retry, dead-lettered, so its aggregate goes to the table; false: published already, a replay);
-- `visible`: the writing transaction is visible to this statement. A row not found whose
-- transaction is visible was deleted (published by --wal-marking delete, or by hand); one whose
-- transaction is not visible yet was streamed a moment too early (PostgreSQL writes the commit
-- record, which the stream sends at once, before the transaction becomes visible) and is claimed
-- again. The full transaction id comes from the snapshot's xmax: the transaction is recent.
WITH snap AS (
    SELECT s, pg_snapshot_xmax(s)::text::bigint AS xmax FROM pg_current_snapshot() AS s
)
SELECT c.id,
       e.id IS NOT NULL AS found,
       coalesce(e.processed_at IS NULL, false) AS pending,
       c.xid = 0 OR pg_visible_in_snapshot(
           ((((snap.xmax >> 32) - CASE WHEN c.xid > (snap.xmax & 4294967295) THEN 1 ELSE 0 END) << 32)
            | c.xid)::text::xid8,
           snap.s) AS visible
FROM unnest($1::uuid[], $2::int8[]) AS c(id, xid)
CROSS JOIN snap
LEFT JOIN outbox_events e ON e.id = c.id
