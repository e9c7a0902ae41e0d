-- The ids among $1 delivered for the first time (a transaction's events, handled together):
-- recorded in the consumer's transaction, returned; the ids recorded before are not.
INSERT INTO processed_events (event_id)
SELECT DISTINCT unnest($1::uuid[])
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id
