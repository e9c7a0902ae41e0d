-- Another relay holds this outbox's arming key ($1), so writers notify and this relay hears it too.
-- pg_locks shows a bigint advisory key as its high (classid) and low (objid) 32 bits.
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND classid::bigint = ($1::bigint >> 32) & 4294967295
      AND objid::bigint = $1::bigint & 4294967295
      AND objsubid = 1
      AND pid <> pg_backend_pid())
