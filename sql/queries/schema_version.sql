-- NULL when the schema was never migrated.
SELECT CASE WHEN to_regclass('outbox_schema_migrations') IS NULL THEN NULL
            ELSE (SELECT max(version) FROM outbox_schema_migrations) END AS version
