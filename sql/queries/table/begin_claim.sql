-- Opens the transaction of a claim, with the planner settings of the relay's own statements. The
-- claim must walk the pending `seq` index in order and stop after LIMIT rows; on a table without
-- fresh statistics (one that filled up since the last autovacuum analyze) the planner otherwise
-- picks a hash/sort plan that reads every pending row on every claim (measured: 557 ms instead of
-- 9 ms per 1,000-row claim at 100k pending). These only add cost to the alternatives, so they
-- steer, never forbid. That added cost would make the planner JIT-compile the claim (about a
-- second each time), hence jit = off; and since it is there in every plan (the byte budget's sort
-- cannot be avoided), custom plans never look cheaper than the generic one, so the prepared claim
-- would be planned again on every execution (1 ms): force_generic_plan. SET LOCAL: they end with
-- the transaction, so behind a transaction pooler no other client ever sees them.
BEGIN;
SET LOCAL enable_sort = off;
SET LOCAL enable_hashjoin = off;
SET LOCAL enable_mergejoin = off;
SET LOCAL enable_seqscan = off;
SET LOCAL jit = off;
SET LOCAL plan_cache_mode = force_generic_plan;
