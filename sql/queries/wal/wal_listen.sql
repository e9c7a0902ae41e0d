-- --source wal: the control connection LISTENs on this outbox's channel (outbox_listen(), schema
-- version 3), where `dead-letters retry` notifies: the relay sweeps the aggregates handed to the
-- table at once instead of at its next fallback tick. It never arms, so writers never notify it.
SELECT outbox_listen()
