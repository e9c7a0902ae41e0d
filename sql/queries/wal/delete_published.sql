-- --source wal with --wal-marking delete: the rows of the batch JetStream acknowledged leave the
-- outbox, in the batch's transaction. The stream holds them from now on; a DELETE costs
-- PostgreSQL less than marking the row (no new row version, no index entry, a WAL record of the
-- key only, which the walsender decodes in a fraction of the time). The rows are found where the
-- claim locked them ($1, their ctid: a TID scan, no primary-key probe each); a locked row does not
-- move. Each ctid ($1) is paired with its row's id ($2), which keeps the statement exact whatever a
-- ctid names (a pairwise test: an `id = ANY($2)` filter would compare each row with every id).
-- The pair is tested as `(e.id = p.id) IS TRUE` (the same, ids are never NULL) so that the primary
-- key cannot serve it: the plan is made once per connection, and one made on an empty table
-- otherwise probed the primary key for every row and tested the ctid after.
DELETE FROM outbox_events e
USING unnest($1::text[]::tid[], $2::uuid[]) AS p(tid, id)
WHERE e.ctid = p.tid AND (e.id = p.id) IS TRUE
