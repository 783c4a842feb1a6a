-- Claims that arrive together go to the database together: one statement
-- runs each through meshwork_claim (claim.sql: the rules and plan choices
-- are all there) and answers, after each claim, the worker's cap and the
-- slots it has left, counted as the claim counts them, so that a
-- ClaimTasks answer takes one round trip instead of two.
--
-- `claims` is a JSON array of {"worker", "caps", "labels", "max",
-- "concurrency", "plan", "reserveAfterMs", "expiredFrom"} (concurrency
-- null: the registered max_concurrency; plan, reserveAfterMs and
-- expiredFrom as meshwork_claim takes them, null when not given). The
-- slots counted are the `slots` resource: the cap less what the worker's
-- live leases hold. Rows: the claimed tasks of claim 0 in claim order
-- (free and cap null), then one
-- row for claim 0 with its free slots and cap (task null; none for an
-- unknown worker), then claim 1, and so on.
--
-- One transaction holds every worker lock it takes until it ends. The
-- caller orders the claims by worker id, so that two batches (on two
-- replicas) take worker locks in the same order and cannot deadlock each
-- other.
--
-- A batch waits at most 2 s for a worker's lock (held by a placement, a
-- deregistration, another replica's batch): past that, the database refuses
-- the batch (55P03), its claims are made again one by one (leases/store.ts)
-- and only the claim for the locked worker waits and fails (`unavailable`).
-- Without it, one lock held long would hold every claim of the replica.
CREATE OR REPLACE FUNCTION meshwork_claim_batch(claims jsonb)
RETURNS TABLE (claim int, free int, cap int, task tasks)
LANGUAGE plpgsql VOLATILE
SET jit = off
SET lock_timeout = '2s'
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
  c jsonb;
  i int := 0;
  w uuid;
  k int;
  head_priority int;
  head_deadline timestamptz;
  head_created timestamptz;
BEGIN
  -- The claim-order key of the first ready task, read once for the batch
  -- (locked or not, due or not): each claim looks from there first
  -- (claim.sql, ready_*), and the batch walks the dead entries at the head
  -- of tasks_ready_idx once instead of once per claim. A task that becomes
  -- ready with an earlier key while the batch runs is the next batch's.
  SELECT t.priority, t.deadline, t.created_at INTO head_priority, head_deadline, head_created
    FROM tasks t
    WHERE t.state = 'PENDING' AND t.dependencies_pending = 0
    ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC
    LIMIT 1;
  FOR c IN SELECT e FROM jsonb_array_elements(claims) AS e LOOP
    w := (c->>'worker')::uuid;
    k := (c->>'concurrency')::int;
    RETURN QUERY
      SELECT i, NULL::int, NULL::int, t
      FROM meshwork_claim(
        w,
        ARRAY(SELECT jsonb_array_elements_text(c->'caps')),
        c->'labels',
        (c->>'max')::int,
        k,
        CASE WHEN jsonb_typeof(c->'plan') = 'object' THEN c->'plan' END,
        (c->>'reserveAfterMs')::int,
        (c->>'expiredFrom')::timestamptz,
        head_priority, head_deadline, head_created) AS t;
    RETURN QUERY
      SELECT i,
        greatest(0, coalesce(k, x.max_concurrency) - meshwork_slots_held(x.id)::int),
        coalesce(k, x.max_concurrency),
        NULL::tasks
      FROM workers x
      WHERE x.id = w;
    i := i + 1;
  END LOOP;
END;
$$;
