-- --source wal: slot $1 was (re)created; its catch-up from the table is to do.
INSERT INTO outbox_wal_slots (slot_name) VALUES ($1::text)
ON CONFLICT (slot_name) DO UPDATE SET created_at = now(), caught_up_at = NULL
