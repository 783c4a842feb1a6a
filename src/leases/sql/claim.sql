-- The claim, as one SQL text: which tasks a worker may take, in which order,
-- and the lease it gets. Every rule of the claim is written here once; the
-- TypeScript side (leases/claim.ts) only calls it, through
-- meshwork_claim_batch (claim-batch.sql).
--
-- Leases up to `max_tasks` claimable tasks to `worker`, bounded by its free
-- slots (its max_concurrency, or `concurrency` when not null, minus its live
-- leases); nothing for a drained or unknown worker. A worker of the REST
-- contract states its concurrency in each claim (POST /tasks/claim).
-- Claimable: PENDING past its not_before, or leased with an expired lease
-- (live-lease.sql) and attempts left (taken at once, without waiting for
-- the sweeper; one out of attempts is left to the sweeper to FAIL). Best
-- first: highest priority, then earliest deadline (none last), then oldest.
-- Rows come back in that order.
--
-- Plan decisions, each measured here:
-- * A function, so that its plan is pinned. With parameters (or statistics
--   that do not know a new workload yet) the planner estimated one matching
--   row and chose a bitmap scan of every PENDING task plus a sort: each claim
--   cost O(backlog), 10 ms at 20,000 pending tasks. With sorts and bitmap
--   scans priced out, the PENDING scan walks tasks_claim_idx in claim order
--   and stops at the LIMIT.
-- * Sequential scans are off too. The claim's plans are cached for the life
--   of a connection (plpgsql keeps a generic plan after a few runs). Planned
--   while the tasks table was small, the UPDATE's `t.id = ANY (…)` became a
--   sequential scan, kept as the table grew to a million rows (179 ms per
--   claim, every row read). With it off, every statement here has its index,
--   whatever the table's size and statistics were when it was planned
--   (test/postgres/claim-plan.test.ts).
-- * Candidates are MATERIALIZED: a plain subquery may be rescanned once per
--   outer row, and each rescan skips the rows this statement already locked,
--   so a claim of `max` tasks took more (Oban warns of the same).
-- * The grant (grant.sql) reaches the picked rows by primary key
--   (`id = ANY(array)`), never by a join: on a table without fresh statistics (autovacuum off,
--   or right after a burst of writes) `UPDATE ... FROM picked` became a hash
--   join over a bitmap of every PENDING row, 116,780 index entries read per
--   claim at 100,000 pending tasks (p50 30 ms instead of 5.8 ms at 10,000).
-- * No JIT: the sorts priced out above make the few unavoidable sorts of
--   tiny sets (the pick, the returned order) look expensive, and past
--   jit_above_cost PostgreSQL compiled the statement: 1.1 s per claim.
-- * SKIP LOCKED: concurrent claimers take disjoint rows and never wait for
--   each other or for a transaction holding a task.
CREATE OR REPLACE FUNCTION meshwork_claim(worker uuid, caps text[], labels jsonb, max_tasks int, concurrency int)
RETURNS SETOF tasks
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
  slots int;
BEGIN
  -- One claim or placement at a time per worker (placement takes the same
  -- lock): its free slots are counted after the lock, in the next statement,
  -- so concurrent claims cannot take more than max_concurrency.
  PERFORM 1 FROM workers w WHERE w.id = worker AND NOT w.drained FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT least(max_tasks, coalesce(concurrency, w.max_concurrency) - meshwork_live_leases(w.id))
    INTO slots
    FROM workers w
    WHERE w.id = worker;
  IF slots <= 0 THEN
    RETURN;
  END IF;
  RETURN QUERY
    WITH pending AS MATERIALIZED (
      SELECT t.id, t.priority, t.deadline, t.created_at
      FROM tasks t
      WHERE t.state = 'PENDING'
        AND (t.not_before IS NULL OR t.not_before <= now())
        AND meshwork_claim_matches(t, caps, labels)
      -- The claim order, as tasks_claim_idx stores it: the scan stops at the LIMIT.
      ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC
      LIMIT slots
      FOR UPDATE OF t SKIP LOCKED
    ), expired AS MATERIALIZED (
      -- Oldest expiry first, as tasks_lease_expiry_idx stores it.
      SELECT t.id, t.priority, t.deadline, t.created_at
      FROM tasks t
      WHERE meshwork_lease_expired(t)
        AND t.failures < t.max_attempts
        AND meshwork_claim_matches(t, caps, labels)
      ORDER BY t.lease_expires_at
      LIMIT slots
      FOR UPDATE OF t SKIP LOCKED
    ), picked AS MATERIALIZED (
      -- The best `slots` of both: ranked by the same claim order.
      SELECT c.id, row_number() OVER (
          ORDER BY c.priority DESC NULLS LAST, c.deadline ASC NULLS LAST, c.created_at ASC) AS rank
      FROM (SELECT * FROM pending UNION ALL SELECT * FROM expired) c
      ORDER BY rank
      LIMIT slots
    )
    -- The lease granted by the one grant statement (grant.sql), RUNNING at
    -- once; the rows come back in the claim order.
    SELECT g.* FROM meshwork_grant(ARRAY(SELECT p.id FROM picked p), worker, false) AS g
      JOIN picked ON picked.id = g.id
      ORDER BY picked.rank;
END;
$$;
