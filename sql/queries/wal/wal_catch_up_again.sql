-- --source wal: the slots of this outbox ($1; NULL: every one) catch up from the table again before
-- they stream. Rows written while the publication did not publish them are in no stream.
UPDATE outbox_wal_slots SET caught_up_at = NULL
WHERE $1::text IS NULL OR slot_name = $1::text
