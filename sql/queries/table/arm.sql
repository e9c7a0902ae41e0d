-- Arm the relay (see outbox_events_notify): waits, bounded by lock_timeout, for every writer that
-- skipped its notification to commit. Session level: held until disarm.sql or disconnect.
-- $1: this outbox's arming key (outbox_wakeup()).
SELECT pg_advisory_lock($1::bigint)
