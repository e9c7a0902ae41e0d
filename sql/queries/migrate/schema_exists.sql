SELECT to_regclass('outbox_schema_migrations') IS NOT NULL
