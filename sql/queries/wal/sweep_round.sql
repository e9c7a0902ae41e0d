-- --source wal: the aggregates a sweep serves, read from the durable record (outbox_wal_deferred,
-- whoever wrote it: this relay, another one, a script): up to $3 of them, going round in key order
-- after ($1, $2), skipping those whose oldest pending row is a dead letter (nothing to do until an
-- operator retries or discards it). So a retried or discarded dead letter's aggregate is served in
-- the next round wherever it stands in the key order, however many others stay blocked. The
-- second branch runs only when the first finds fewer than $3 (the round wraps).
(SELECT d.aggregate_type, d.aggregate_id
 FROM outbox_wal_deferred d
 WHERE (d.aggregate_type, d.aggregate_id) > ($1::text, $2::text)
   AND NOT EXISTS (
       SELECT 1 FROM (
           SELECT o.dead_lettered_at
           FROM outbox_events o
           WHERE o.processed_at IS NULL
             AND o.aggregate_type = d.aggregate_type
             AND o.aggregate_id >= d.aggregate_id AND o.aggregate_id <= d.aggregate_id
           ORDER BY o.aggregate_id, o.seq
           LIMIT 1) h
       WHERE h.dead_lettered_at IS NOT NULL)
 ORDER BY d.aggregate_type, d.aggregate_id
 LIMIT $3)
UNION ALL
(SELECT d.aggregate_type, d.aggregate_id
 FROM outbox_wal_deferred d
 WHERE (d.aggregate_type, d.aggregate_id) <= ($1::text, $2::text)
   AND NOT EXISTS (
       SELECT 1 FROM (
           SELECT o.dead_lettered_at
           FROM outbox_events o
           WHERE o.processed_at IS NULL
             AND o.aggregate_type = d.aggregate_type
             AND o.aggregate_id >= d.aggregate_id AND o.aggregate_id <= d.aggregate_id
           ORDER BY o.aggregate_id, o.seq
           LIMIT 1) h
       WHERE h.dead_lettered_at IS NOT NULL)
 ORDER BY d.aggregate_type, d.aggregate_id
 LIMIT $3)
LIMIT $3
