-- --source wal: appended to the claim's BEGIN (begin_claim.sql) on the worker connections. The
-- slot's position moves past a batch's events once its transaction committed (the published rows
-- deleted, failures recorded, aggregates handed to the table). Committed asynchronously
-- (synchronous_commit = off), that commit may still be in the WAL buffers when the slot saves its
-- position (at a checkpoint, or when its restart point moves): a crash would keep the position
-- and lose the record, and with it an aggregate handed to the table. So `off` becomes `local`
-- (flushed here before COMMIT returns); any other setting is kept (`on`, `remote_apply`: stronger
-- still). Not `on` always: the slot lives on this server only (not a failover slot), and the
-- relay would wait for a synchronous standby the operator chose not to wait for. Transaction-local,
-- like the planner settings.
SELECT set_config('synchronous_commit', 'local', true)
WHERE current_setting('synchronous_commit') = 'off';
