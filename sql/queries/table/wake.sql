-- Wake every listening relay of this outbox (operator changes make rows claimable without an
-- INSERT; a relay that stops hands its backlog over).
SELECT pg_notify(channel, '') FROM outbox_wakeup()
