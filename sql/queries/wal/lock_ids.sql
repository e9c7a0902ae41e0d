-- --source wal with --wal-marking delete: lock, in one statement, the rows with these ids ($1)
-- that are pending and eligible, skipping rows another session holds, and read them. Nothing is
-- marked: the batch deletes the rows JetStream acknowledged (`delete_published.sql`) and records
-- the failures, in this transaction, which commits after the acks; rows held back stay as they
-- are. One primary-key probe per id, as in claim_ids.sql. `tid` (last): where the row is, for
-- that delete.
SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type,
       e.payload::text AS payload, e.headers::text AS headers, e.attempts, e.created_at,
       true AS eligible, false AS held, e.ctid::text AS tid
FROM outbox_events e
WHERE e.id = ANY($1::uuid[])
  AND coalesce(e.processed_at IS NULL, false)
  AND outbox_eligible(e.dead_lettered_at, e.retry_after)
FOR UPDATE OF e SKIP LOCKED
