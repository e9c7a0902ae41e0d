-- $1: this outbox's arming key (outbox_wakeup()).
SELECT pg_advisory_unlock($1::bigint)
