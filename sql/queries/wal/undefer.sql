-- --source wal: aggregates ($1 types, $2 ids) the table has no pending row of any more: the
-- stream publishes their events again.
DELETE FROM outbox_wal_deferred d
USING unnest($1::text[], $2::text[]) AS a(aggregate_type, aggregate_id)
WHERE d.aggregate_type = a.aggregate_type AND d.aggregate_id = a.aggregate_id
