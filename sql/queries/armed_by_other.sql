-- Another relay holds the arming key, so writers notify and this relay hears it too.
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND classid = 1 AND objid = 2955042706 AND objsubid = 1
      AND pid <> pg_backend_pid())
