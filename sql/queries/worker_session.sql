-- Session settings of the relay's worker connection. The claim must walk the pending `seq` index in
-- order and stop after LIMIT rows; on a table without fresh statistics (one that filled up since the
-- last autovacuum analyze) the planner otherwise picks a hash/sort plan that reads every pending row
-- on every claim (measured: 557 ms instead of 9 ms per 1,000-row claim at 100k pending). These only
-- add cost to the alternatives, so they steer, never forbid, and affect only the relay's own queries.
SET enable_sort = off;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_seqscan = off;
