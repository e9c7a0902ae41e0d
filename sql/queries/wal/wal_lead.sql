-- --source wal: become the relay that streams from slot $1, or learn that another one does. A
-- session lock on the caller's control connection: it ends with that connection, so a relay that
-- dies (kill -9, lost network) hands over as soon as PostgreSQL notices.
SELECT pg_try_advisory_lock(hashtextextended('outbox-relay:wal:' || $1::text, 7250010002))
