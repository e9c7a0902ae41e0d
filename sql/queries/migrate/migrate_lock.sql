-- The lock that serialises concurrent `migrate` runs (released at commit); migrate_prepare.sql
-- takes it too. Taken first on its own when `migrate` creates the schema.
SELECT pg_advisory_xact_lock(7250010001)
