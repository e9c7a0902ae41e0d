-- Statements granting a writer role what `enqueue` needs and nothing more: INSERT into the outbox
-- (the trigger function and the advisory lock it takes are executable by everyone), SELECT of the
-- id column for `RETURNING id`, and what idempotent consumers need on processed_events.
-- $1 = role. Run each returned statement.
SELECT format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), $1::text)
UNION ALL SELECT format('GRANT INSERT ON outbox_events TO %I', $1::text)
UNION ALL SELECT format('GRANT SELECT (id) ON outbox_events TO %I', $1::text)
UNION ALL SELECT format('GRANT SELECT, INSERT ON processed_events TO %I', $1::text)
