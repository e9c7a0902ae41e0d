-- `migrate --wal`: this outbox's publication (outbox_wal_publication()) and the statement that
-- creates it, NULL when it exists. Inserts only: the relay's own updates (marks, retries) and
-- deletes (cleanup) never reach the replication stream. Publications are database-wide; the table
-- is named with its schema.
SELECT outbox_wal_publication() AS name,
       CASE WHEN NOT EXISTS (SELECT FROM pg_publication WHERE pubname = outbox_wal_publication())
            THEN format('CREATE PUBLICATION %I FOR TABLE %I.outbox_events WITH (publish = %L)',
                        outbox_wal_publication(), current_schema(), 'insert')
       END AS create_statement
