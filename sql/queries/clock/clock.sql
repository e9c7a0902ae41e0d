-- The database's clock, for the relay to put the moments it sees (a JetStream ack) on it before
-- comparing them with times the database wrote (created_at).
SELECT clock_timestamp()
