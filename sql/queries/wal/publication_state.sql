-- --source wal: does this outbox's publication (outbox_wal_publication()) publish every insert into
-- this schema's outbox_events? What the relay checks before it streams (and while it streams), and
-- the statements `migrate --wal` creates or repairs it with. Publications are database-wide: the
-- table is named with its schema. pg_publication_tables lists the table however the publication
-- takes it in (by name, by schema, FOR ALL TABLES). Row filters and column lists (PostgreSQL 15)
-- are read through jsonb: servers without those columns read NULL.
WITH outbox AS (
    SELECT c.oid, n.nspname
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass('outbox_events')
), target AS (
    SELECT outbox_wal_publication() AS pubname,
           coalesce((SELECT nspname FROM outbox), current_schema()) AS nspname
), listed AS (
    SELECT to_jsonb(t) AS t
    FROM pg_publication_tables t, target
    WHERE t.pubname = target.pubname AND t.schemaname = target.nspname
      AND t.tablename = 'outbox_events'
)
SELECT target.pubname AS name,
       target.nspname || '.outbox_events' AS table_name,
       target.nspname AS table_schema,
       (SELECT oid FROM outbox) AS table_oid,
       p.oid IS NOT NULL AS publication_exists,
       coalesce(p.pubinsert, false) AS publishes_inserts,
       coalesce(p.puballtables, false) AS all_tables,
       EXISTS (SELECT FROM listed) AS lists_table,
       EXISTS (SELECT FROM listed
               WHERE t ->> 'rowfilter' IS NOT NULL
                  OR NOT coalesce((t -> 'attnames') ?& ARRAY['id', 'aggregate_type', 'aggregate_id'],
                                  true)) AS filters_table,
       -- Inserts only: the relay's own updates (marks, retries) and deletes (cleanup) never reach
       -- the replication stream.
       format('CREATE PUBLICATION %I FOR TABLE %I.outbox_events WITH (publish = %L)',
              target.pubname, target.nspname, 'insert') AS create_statement,
       format('ALTER PUBLICATION %I SET (publish = %L)', target.pubname, 'insert') AS publish_statement,
       format('ALTER PUBLICATION %I ADD TABLE %I.outbox_events',
              target.pubname, target.nspname) AS add_statement,
       format('ALTER PUBLICATION %I DROP TABLE %I.outbox_events',
              target.pubname, target.nspname) AS drop_statement
FROM target
LEFT JOIN pg_publication p ON p.pubname = target.pubname
