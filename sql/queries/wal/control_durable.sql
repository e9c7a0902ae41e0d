-- --source wal: the control connection's session (its own, never pooled) commits durably, as the
-- worker connections' batches do (begin_durable.sql): the aggregates it hands to the table at start
-- (deferred.sql) must be on disk before the slot moves past their streamed events; the slot's
-- catch-up marks (slot_created.sql, slot_caught_up.sql) before the slot they describe is used.
-- `off` becomes `local`; any other setting is kept.
SELECT set_config('synchronous_commit', 'local', false)
WHERE current_setting('synchronous_commit') = 'off'
