-- outbox-relay schema, version 10: the transactions whose published rows --source wal with
-- --wal-marking delete keeps (marked) for their count, recorded durably, so that the rows go once
-- the transaction is done even when no batch holds it again: its last pending event discarded
-- (`dead-letters discard`), or its last events published by a batch that could not yet see
-- another batch's marks (two relays, each with part of it). Without it those rows stayed until
-- `cleanup`, and a run's row of outbox_transaction_runs for good.
--
-- One row per transaction, written in the batch's transaction that marks the first of its rows
-- and deleted with them. A relay on version 9 keeps its marked rows as before (until a batch
-- that holds the transaction finds it done, or `cleanup`); rows it marked are not recorded here,
-- and `cleanup` deletes them as it always did.
CREATE TABLE IF NOT EXISTS outbox_kept_transactions (
    txid    xid8        PRIMARY KEY,
    -- When a relay first kept a published row of it: an old one is a transaction still waiting
    -- for an event (a retry, a dead letter).
    kept_at timestamptz NOT NULL DEFAULT now()
);
