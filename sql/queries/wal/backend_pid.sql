-- The connection's server process (to cancel its statement from another connection).
SELECT pg_backend_pid()
