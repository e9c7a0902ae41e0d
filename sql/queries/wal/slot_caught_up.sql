-- --source wal: the catch-up from the table behind slot $1 is done.
UPDATE outbox_wal_slots SET caught_up_at = now() WHERE slot_name = $1::text
