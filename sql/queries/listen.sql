-- This outbox's LISTEN statement and arming key (schema version 2: derived from its schema).
SELECT format('LISTEN %I', channel) AS listen, lock_key FROM outbox_wakeup()
