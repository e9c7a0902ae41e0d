-- Wake every listening relay (operator changes make rows claimable without an INSERT).
SELECT pg_notify('outbox_event', '')
