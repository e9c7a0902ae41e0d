-- The relays connected to this database, by the application name their connections carry
-- (outbox-relay, outbox-relay-listener, outbox-relay-wal), per client address. The address and
-- start time of another role's sessions need pg_read_all_stats.
SELECT application_name, host(client_addr) AS client_addr, count(*) AS connections,
       min(backend_start) AS since
FROM pg_stat_activity
WHERE datname = current_database()
  AND application_name LIKE 'outbox-relay%'
  AND application_name NOT IN ('outbox-relay-console', 'outbox-relay-cli')
GROUP BY application_name, client_addr
ORDER BY application_name, client_addr
