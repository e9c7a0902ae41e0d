-- --source wal: drop slot $1 after PostgreSQL invalidated it (it can no longer stream); the relay
-- creates it again and catches up from the table.
SELECT pg_drop_replication_slot($1::text)
