-- The listener's session: lock_timeout $1 bounds arming (see arm.sql); outbox_listen() (schema
-- version 3) LISTENs on this outbox's channel, from the commit of this statement, and returns its
-- arming key. Channel and key derive from the schema (outbox_wakeup()).
SELECT set_config('lock_timeout', $1::text, false) AS lock_timeout, outbox_listen() AS lock_key
