SELECT version FROM outbox_schema_migrations ORDER BY version
