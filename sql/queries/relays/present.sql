-- Whether this schema has outbox_relays (version 8): a relay on an older one reports nothing.
SELECT to_regclass('outbox_relays') IS NOT NULL AS present
