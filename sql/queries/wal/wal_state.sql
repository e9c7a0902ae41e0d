-- --source wal, before streaming: the server's wal_level and slot $1 (NULL columns: no such slot);
-- and where this server is (address and port as this connection reached it; NULL address: a Unix
-- socket), for the stream to reach the same one. The publication: publication_state.sql.
SELECT current_setting('wal_level') AS wal_level,
       host(inet_server_addr()) AS server_addr, inet_server_port() AS server_port,
       s.plugin, s.database, current_database() AS current_database, s.wal_status,
       s.active_pid,
       -- A slot whose catch-up from the table never finished (a relay died during it, or the
       -- slot was created by hand) catches up again.
       coalesce((SELECT w.caught_up_at IS NOT NULL FROM outbox_wal_slots w
                 WHERE w.slot_name = $1::text), false) AS caught_up,
       -- Version 6: a row changed after its insert is marked `rewritten` (a trigger that fires for
       -- ordinary sessions: 'O', 'A'), so a streamed row may be published from what the stream
       -- carried.
       EXISTS (SELECT FROM pg_trigger t
               WHERE t.tgrelid = to_regclass('outbox_events')
                 AND t.tgname = 'outbox_events_rewritten'
                 AND t.tgenabled IN ('O', 'A')) AS rewrites_marked
FROM (SELECT 1) AS one
LEFT JOIN pg_replication_slots s ON s.slot_name = $1::text
