ALTER TABLE "workers" ADD COLUMN "peer_id" text;--> statement-breakpoint
ALTER TABLE "workers" ADD CONSTRAINT "workers_peer_id_key" UNIQUE("peer_id");
--> statement-breakpoint

-- The claim of 0006_claim.sql (its comments give the plan decisions), with
-- one more parameter: `concurrency`, when not null, stands for the
-- worker's registered max_concurrency in this claim. A worker of the REST
-- contract states its concurrency in each claim (POST /tasks/claim).
DROP FUNCTION meshwork_claim(uuid, text[], jsonb, int);
--> statement-breakpoint

CREATE FUNCTION meshwork_claim(worker uuid, caps text[], labels jsonb, max_tasks int, concurrency int)
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
