-- --source wal with --wal-marking delete: the rows JetStream acknowledged ($1) that a claim from
-- the table found (the catch-up behind a new slot), by id (see delete_published.sql).
DELETE FROM outbox_events WHERE id = ANY($1::uuid[])
