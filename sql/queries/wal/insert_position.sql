-- --source wal: the server's WAL insert position, read after a claim's statements in its
-- transaction: past the commit of every row they saw. A claimed row behind an older pending row of
-- its aggregate that the stream has not brought waits until the stream reaches it (the older row
-- may have committed after it, not streamed yet); past it, the older row is in no stream.
SELECT pg_current_wal_insert_lsn() AS lsn
