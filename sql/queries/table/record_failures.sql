-- One statement for every failed row of a batch. $1 ids, $2 errors, $3 retry delays (ms),
-- $4 dead-letter flags, $5 attempts spent (0 or 1). The claim marked these rows processed; this puts
-- them back to pending in the same transaction.
UPDATE outbox_events AS e
SET processed_at     = NULL,
    -- Rows written by raw SQL may hold any count: never overflow, count a negative one from zero.
    attempts         = CASE WHEN e.attempts < 2147483647 THEN greatest(e.attempts, 0) + f.spent
                            ELSE e.attempts END,
    last_error       = f.error,
    retry_after      = CASE WHEN f.dead THEN NULL ELSE now() + f.delay_ms * interval '1 millisecond' END,
    dead_lettered_at = CASE WHEN f.dead THEN now() ELSE NULL END
FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bool[], $5::int[]) AS f(id, error, delay_ms, dead, spent)
WHERE e.id = f.id
