-- --source wal with --wal-marking delete: the rows of the batch JetStream acknowledged ($1) leave
-- the outbox, in the batch's transaction. The stream holds them from now on; a DELETE costs
-- PostgreSQL less than marking the row (no new row version, no index entry, a WAL record of the
-- key only, which the walsender decodes in a fraction of the time).
DELETE FROM outbox_events WHERE id = ANY($1::uuid[])
