-- Does the outbox table record each row's transaction (schema version 9's txid)? A relay on an
-- older schema publishes without the Outbox-Transaction-* headers.
SELECT EXISTS (
    SELECT FROM pg_attribute
    WHERE attrelid = to_regclass('outbox_events')
      AND attname = 'txid'
      AND NOT attisdropped
) AS has_transactions
