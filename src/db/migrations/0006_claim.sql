-- The claim, as one SQL text: which tasks a worker may take, in which order,
-- and the lease it gets. Every rule of the claim is written here once; the
-- TypeScript side (src/leases/claim.ts) only calls meshwork_claim.
--
-- It replaces meshwork_claim_candidates (0002), which pinned the plan of the
-- PENDING scan only, while the rest of the statement was built in TypeScript
-- and repeated the matching rules and the order.

-- A new lease token: 64 hex digits from the database's CSPRNG (two v4 UUIDs,
-- 244 random bits).
CREATE FUNCTION meshwork_new_token() RETURNS text
LANGUAGE sql VOLATILE
AS $$
  SELECT replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '')
$$;
--> statement-breakpoint

-- The live leases a worker holds: ASSIGNED or RUNNING under it and not
-- expired, pulled or pushed. `except_task` leaves out a task being re-placed.
CREATE FUNCTION meshwork_live_leases(worker uuid, except_task uuid DEFAULT NULL) RETURNS int
LANGUAGE sql STABLE
AS $$
  SELECT count(*)::int FROM tasks t
  WHERE t.lease_worker_id = worker
    AND t.state IN ('ASSIGNED', 'RUNNING')
    AND t.lease_expires_at > now()
    AND t.id IS DISTINCT FROM except_task
$$;
--> statement-breakpoint

-- Whether a worker offering `caps` and `labels` may run task `t`: before its
-- deadline, its workload and every required capability offered, and every
-- affinity entry equal to one of the worker's labels. A plain SQL function,
-- inlined by the planner where it is used.
CREATE FUNCTION meshwork_claim_matches(t tasks, caps text[], labels jsonb) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT (t.deadline IS NULL OR t.deadline > now())
     AND t.workload = ANY (caps)
     AND t.required_capabilities <@ caps
     AND t.affinity <@ labels
$$;
--> statement-breakpoint

-- Leases up to `max_tasks` claimable tasks to `worker`, bounded by its free
-- slots (max_concurrency minus its live leases); nothing for a drained or
-- unknown worker. Claimable: PENDING past its not_before, or leased with an
-- expired lease and attempts left (taken at once, without waiting for the
-- sweeper; one out of attempts is left to the sweeper to FAIL). Best first:
-- highest priority, then earliest deadline (none last), then oldest. Rows
-- come back in that order.
--
-- Plan decisions, each measured here:
-- * A function, so that its plan is pinned. With parameters (or statistics
--   that do not know a new workload yet) the planner estimated one matching
--   row and chose a bitmap scan of every PENDING task plus a sort: each claim
--   cost O(backlog), 10 ms at 20,000 pending tasks. With sorts and bitmap
--   scans priced out, the PENDING scan walks tasks_claim_idx in claim order
--   and stops at the LIMIT.
-- * Candidates are MATERIALIZED: a plain subquery may be rescanned once per
--   outer row, and each rescan skips the rows this statement already locked,
--   so a claim of `max` tasks took more (Oban warns of the same).
-- * The UPDATE reaches the picked rows by primary key (`id = ANY(array)`),
--   never by a join: on a table without fresh statistics (autovacuum off,
--   or right after a burst of writes) `UPDATE ... FROM picked` became a hash
--   join over a bitmap of every PENDING row, 116,780 index entries read per
--   claim at 100,000 pending tasks (p50 30 ms instead of 5.8 ms at 10,000).
-- * No JIT: the sorts priced out above make the few unavoidable sorts of
--   tiny sets (the pick, the returned order) look expensive, and past
--   jit_above_cost PostgreSQL compiled the statement: 1.1 s per claim.
-- * SKIP LOCKED: concurrent claimers take disjoint rows and never wait for
--   each other or for a transaction holding a task.
CREATE FUNCTION meshwork_claim(worker uuid, caps text[], labels jsonb, max_tasks int)
RETURNS SETOF tasks
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
SET enable_bitmapscan = off
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
  SELECT least(max_tasks, w.max_concurrency - meshwork_live_leases(w.id))
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
      SELECT t.id, t.priority, t.deadline, t.created_at
      FROM tasks t
      WHERE t.state IN ('ASSIGNED', 'RUNNING')
        AND t.lease_expires_at <= now()
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
    ), claimed AS (
      -- The picked rows are locked by this statement: they are as selected.
      UPDATE tasks t SET
        state = 'RUNNING',
        attempt = t.attempt + 1,
        lease_worker_id = worker,
        lease_token = meshwork_new_token(),
        lease_expires_at = now() + make_interval(secs => t.lease_seconds),
        -- A task taken over from an expired lease says so.
        error_code = CASE WHEN t.state <> 'PENDING' THEN 'LEASE_EXPIRED' ELSE t.error_code END,
        error_message = CASE WHEN t.state <> 'PENDING'
          THEN 'the lease on attempt ' || t.attempt || ' expired' ELSE t.error_message END,
        assigned_worker_id = NULL,
        assigned_api_base_url = '',
        not_before = NULL,
        cancel_requested = false,
        started_at = coalesce(t.started_at, now()),
        updated_at = now()
      WHERE t.id = ANY (ARRAY(SELECT p.id FROM picked p))
      RETURNING t.*
    )
    SELECT claimed.* FROM claimed JOIN picked ON picked.id = claimed.id ORDER BY picked.rank;
END;
$$;
--> statement-breakpoint

DROP FUNCTION meshwork_claim_candidates(text[], jsonb, int);
