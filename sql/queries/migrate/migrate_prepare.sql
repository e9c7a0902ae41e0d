-- Serialises concurrent `migrate` runs (released at commit) and records applied versions.
SELECT pg_advisory_xact_lock(7250010001);
CREATE TABLE IF NOT EXISTS outbox_schema_migrations (
    version    int         PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
