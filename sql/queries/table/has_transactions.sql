-- Does the outbox record each row's transaction (schema version 9: outbox_events.txid, and
-- outbox_transaction_runs, which the transaction headers' statements read too)? A relay on an
-- older schema, or on one where only the column was added ahead of `migrate`, publishes without
-- the Outbox-Transaction-* headers.
SELECT EXISTS (
           SELECT FROM pg_attribute
           WHERE attrelid = to_regclass('outbox_events')
             AND attname = 'txid'
             AND NOT attisdropped
       )
       AND to_regclass('outbox_transaction_runs') IS NOT NULL AS has_transactions
