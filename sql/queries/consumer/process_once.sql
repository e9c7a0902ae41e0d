-- True on the first delivery of an event id, false on a repeat. Runs in the consumer's transaction.
INSERT INTO processed_events (event_id) VALUES ($1)
ON CONFLICT (event_id) DO NOTHING
RETURNING true
