-- --source wal, on shutdown: cancels what the control connection ($1, its server process) is
-- waiting for (creating a slot waits for open transactions, without end for a forgotten one).
SELECT pg_cancel_backend($1::int)
