-- The relays running against this outbox, each reporting itself every --stats-interval (schema
-- version 8): what the console lists as relays, one row each, where pg_stat_activity shows
-- connections (a relay holds three or four, and any session may take its application name). A
-- relay adds its row at start, updates it at each report and deletes it at a clean stop; a row
-- not updated for a day (a relay killed) is deleted by the next report of any relay. Figures are
-- the relay's own, as its /metrics has them: its published total and the last minute's, the time
-- of its last publish, the oldest pending event's age and, with --source wal, the WAL its slot
-- retains. A relay started before this version reports nothing; one on an older schema skips it.
CREATE TABLE IF NOT EXISTS outbox_relays (
    id                     uuid PRIMARY KEY,
    host                   text NOT NULL,
    pid                    integer NOT NULL,
    version                text NOT NULL,
    source                 text NOT NULL,
    slot                   text,
    interval_seconds       double precision NOT NULL,
    started_at             timestamptz NOT NULL DEFAULT now(),
    seen_at                timestamptz NOT NULL DEFAULT now(),
    last_publish_at        timestamptz,
    published_total        bigint NOT NULL DEFAULT 0,
    published_last_minute  bigint NOT NULL DEFAULT 0,
    oldest_pending_seconds double precision,
    slot_lag_bytes         double precision
);
