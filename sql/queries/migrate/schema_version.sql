-- The newest applied schema version. Run only after schema_exists.sql said the table exists.
SELECT max(version) FROM outbox_schema_migrations
