-- --source wal with --wal-marking delete: lock, in one statement, the rows the stream carried (each
-- `seq`, $1, paired with its row's id, $2) that are pending and eligible, skipping rows another
-- session holds, as lock_ids.sql does, but without reading their content: the stream carried it.
-- The rows are found by `seq` on the pending rows' index: a batch's seqs are close together, so
-- their probes walk the same few index pages, where probes by a random uuid land on a page each
-- (about 1.4 us less per row, measured). A row found at a streamed row's seq is locked only if it
-- is that row (its id: a row inserted with the seq of a deleted one is not); a streamed row not
-- found here (its seq changed) is looked up by id as any missing row is. Whether that content is
-- the row as it is now: `xmin`, the transaction that wrote the row's version (a row changed after
-- the streamed transaction has another), and `rewritten` (changed in its own transaction: see the
-- version 6 migration). Rows whose content is not the row's are then read with lock_ids.sql, still
-- locked by this transaction. `tid`: where the row is, for its delete after the acks.
--
-- One probe of the pending `seq` index per streamed row, whatever the table held when the plan was
-- made (once per connection, with the planner settings of begin_claim.sql): the lookup is a
-- lateral subquery (its FOR UPDATE keeps it one: each run of it sees one pair); the id is tested as
-- `(e.id = p.id) IS TRUE` (the same, ids are never NULL) so that the primary key cannot serve it;
-- and the seq as a range of one value in seq order, which only the pending `seq` index gives
-- without a sort. An equality would let the planner take the pending aggregate index, whose `seq`
-- comes third: on a new table it costs the same as a probe, and it then scans every pending row
-- for each pair (a relay started before a burst fell behind its writers, measured).
-- `prev`: the row's nearest older pending row of its aggregate (NULL: none), one backward probe of
-- the pending aggregate index (a one-value range of aggregate_id in descending (aggregate_id, seq)
-- order, which only that index gives without a sort). The relay publishes a streamed row only when
-- that row is one it knows (streamed, in flight, or resolved a moment ago); otherwise the table
-- holds an older event of the aggregate that no stream carried (skipped, or left by an earlier
-- relay) and the aggregate goes to the table, which publishes in seq order.
SELECT e.id, e.tid, e.xmin, e.rewritten, e.prev
FROM unnest($1::int8[], $2::uuid[]) AS p(seq, id)
CROSS JOIN LATERAL (
    SELECT e.id, e.ctid::text AS tid, e.xmin::text::int8 AS xmin,
           coalesce(e.rewritten, false) AS rewritten,
           (SELECT o.id FROM outbox_events o
                   WHERE o.processed_at IS NULL
                     AND o.aggregate_type = e.aggregate_type
                     AND o.aggregate_id >= e.aggregate_id AND o.aggregate_id <= e.aggregate_id
                     AND o.seq < e.seq
                   ORDER BY o.aggregate_id DESC, o.seq DESC
                   LIMIT 1) AS prev
    FROM outbox_events e
    WHERE e.seq >= p.seq AND e.seq <= p.seq
      AND (e.id = p.id) IS TRUE
      AND e.processed_at IS NULL
      AND outbox_eligible(e.dead_lettered_at, e.retry_after)
    ORDER BY e.seq
    FOR UPDATE OF e SKIP LOCKED
) e
