-- outbox-relay schema, version 9: each event records the database transaction that wrote it, so
-- that the relay can tell consumers where a transaction's events begin and end (the headers
-- Outbox-Transaction-Id, -Index and -Events); and an index of the dead letters by when they died,
-- for the console's list sorted by time dead.
--
-- txid: pg_current_xact_id() of the writing transaction (64 bits: it never wraps). The column is
-- added without a default, then given one: PostgreSQL rewrites nothing (a default added with the
-- column would be computed once and stored as every existing row's value), rows written before
-- this version keep NULL and are published without transaction headers, and every later INSERT
-- that does not name the column records its transaction at no measurable cost (the writer's
-- transaction has its id already when it inserts). A writer that names the column takes what it
-- gives: NULL (no transaction headers) or another transaction's id (its events are announced as
-- that transaction's).
--
-- outbox_events_txid_idx: the relay counts a transaction's events and finds each one's place among
-- them (by seq) when it publishes them. One entry per INSERT, at the right end of the index (ids
-- only grow). Like version 7, a plain CREATE INDEX in the migration's transaction: it blocks writes
-- to outbox_events while it builds, which takes as long as the table is big. On a big table build
-- it first without blocking writers, outside any transaction (psql, autocommit), after adding the
-- column:
--
--   ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS txid xid8;
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_txid_idx ON outbox_events (txid, seq);
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_dead_letters_time_idx
--       ON outbox_events (dead_lettered_at, seq)
--       WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL;
--
-- then migrate: IF NOT EXISTS finds them and this version only records itself. An INVALID index
-- (a CONCURRENTLY build that failed or is still running) is refused with what to do instead.
DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['outbox_events_txid_idx', 'outbox_events_dead_letters_time_idx'] LOOP
        IF EXISTS (SELECT FROM pg_index
                   WHERE indexrelid = to_regclass(name) AND NOT indisvalid) THEN
            RAISE EXCEPTION 'index % is INVALID (a CREATE INDEX CONCURRENTLY that failed or is still running)', name
                USING HINT = format('wait for the build to finish, or DROP INDEX CONCURRENTLY %s and build it again; then run migrate', name);
        END IF;
    END LOOP;
END
$$;

ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS txid xid8;
ALTER TABLE outbox_events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

CREATE INDEX IF NOT EXISTS outbox_events_txid_idx ON outbox_events (txid, seq);

-- --source wal with --wal-marking delete deletes what it publishes. The count of a transaction it
-- publishes over several batches must survive the rows published first: for a transaction whose
-- rows are consecutive seqs (a bulk INSERT, any transaction no other wrote beside), its first seq
-- and count are kept here, one row per transaction, from its first batch until it is all
-- published; the rows of other such transactions are kept in outbox_events, marked, until then.
CREATE TABLE IF NOT EXISTS outbox_transaction_runs (
    txid      xid8   PRIMARY KEY,
    first_seq bigint NOT NULL,
    events    bigint NOT NULL
);

-- The dead letters by the time they died: the console's list sorted by time dead reads it in
-- order. Written when a row is dead-lettered, never by a writer's INSERT or a publish.
CREATE INDEX IF NOT EXISTS outbox_events_dead_letters_time_idx
    ON outbox_events (dead_lettered_at, seq)
    WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL;
