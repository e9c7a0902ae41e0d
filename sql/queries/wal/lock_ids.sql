-- --source wal with --wal-marking delete: lock, in one statement, the rows with these ids ($1)
-- that are pending and eligible, skipping rows another session holds, and read them. Nothing is
-- marked: the batch deletes the rows JetStream acknowledged (`delete_published.sql`) and records
-- the failures, in this transaction, which commits after the acks; rows held back stay as they
-- are. One primary-key probe per id, as in claim_ids.sql. `tid` (last): where the row is, for
-- that delete.
-- `prev`: the row's nearest older pending row of its aggregate (NULL: none), one backward probe of
-- the pending aggregate index (a one-value range of aggregate_id in descending (aggregate_id, seq)
-- order, which only that index gives without a sort). The relay publishes a streamed row only when
-- that row is one it knows (streamed, in flight, or resolved a moment ago); otherwise the table
-- holds an older event of the aggregate that no stream carried (skipped, or left by an earlier
-- relay) and the aggregate goes to the table, which publishes in seq order.
SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type,
       e.payload::text AS payload, e.headers::text AS headers, e.attempts, e.created_at,
       e.txid::text AS txid,
       true AS eligible, false AS held,
       (SELECT o.id FROM outbox_events o
               WHERE o.processed_at IS NULL
                 AND o.aggregate_type = e.aggregate_type
                 AND o.aggregate_id >= e.aggregate_id AND o.aggregate_id <= e.aggregate_id
                 AND o.seq < e.seq
               ORDER BY o.aggregate_id DESC, o.seq DESC
               LIMIT 1) AS prev,
       e.ctid::text AS tid,
       false AS alone
FROM outbox_events e
WHERE e.id = ANY($1::uuid[])
  AND coalesce(e.processed_at IS NULL, false)
  AND outbox_eligible(e.dead_lettered_at, e.retry_after)
FOR UPDATE OF e SKIP LOCKED
