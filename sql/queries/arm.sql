-- Arm the relay (see outbox_events_notify): waits, bounded by lock_timeout, for every writer that
-- skipped its notification to commit. Session level: held until disarm.sql or disconnect.
SELECT pg_advisory_lock(7250010002)
