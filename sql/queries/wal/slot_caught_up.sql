-- --source wal: the catch-up from the table behind slot $1 is done. An upsert: a slot created by
-- hand has no row until then, and without one `migrate --wal` could not mark it to catch up again
-- (wal_catch_up_again.sql), nor a streaming leader tell that it was.
INSERT INTO outbox_wal_slots (slot_name, caught_up_at) VALUES ($1::text, now())
ON CONFLICT (slot_name) DO UPDATE SET caught_up_at = now()
