-- --source wal, while creating slot waits: what it waits for. A logical slot starts from a
-- consistent point, which needs every transaction holding an xid when it began to end: here those
-- still open (other than the creating session, $1), and prepared transactions (which a forgotten
-- two-phase commit keeps forever), oldest first.
SELECT holder FROM (
    SELECT format('server process %s (%s, %s, transaction open for %s)', a.pid,
                  coalesce(nullif(a.application_name, ''), 'no application_name'), a.state,
                  date_trunc('second', now() - a.xact_start)) AS holder,
           a.xact_start AS since
    FROM pg_stat_activity a
    WHERE a.backend_xid IS NOT NULL AND a.pid <> $1::int
    UNION ALL
    SELECT format('prepared transaction %L (prepared %s ago; COMMIT PREPARED or ROLLBACK PREPARED it)',
                  p.gid, date_trunc('second', now() - p.prepared)),
           p.prepared
    FROM pg_prepared_xacts p
) w
ORDER BY since
LIMIT 5
