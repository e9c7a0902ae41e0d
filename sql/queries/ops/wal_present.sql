-- outbox-relay status: does this outbox's schema have the tables of --source wal (version 5)?
SELECT to_regclass('outbox_wal_slots') IS NOT NULL
