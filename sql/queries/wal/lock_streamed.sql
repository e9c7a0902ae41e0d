-- --source wal with --wal-marking delete: lock, in one statement, the rows with these ids ($1)
-- that are pending and eligible, skipping rows another session holds, as lock_ids.sql does, but
-- without reading their content: the stream carried it. Whether that content is the row as it is
-- now: `xmin`, the transaction that wrote the row's version (a row changed after the streamed
-- transaction has another), and `rewritten` (changed in its own transaction: see the version 6
-- migration). Rows whose content is not the row's are then read with lock_ids.sql, still locked by
-- this transaction. `tid`: where the row is, for its delete after the acks.
SELECT e.id, e.ctid::text AS tid, e.xmin::text::int8 AS xmin,
       coalesce(e.rewritten, false) AS rewritten
FROM outbox_events e
WHERE e.id = ANY($1::uuid[])
  AND coalesce(e.processed_at IS NULL, false)
  AND outbox_eligible(e.dead_lettered_at, e.retry_after)
FOR UPDATE OF e SKIP LOCKED
