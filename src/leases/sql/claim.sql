-- The claim, as one SQL text: which tasks a worker may take, in which order,
-- and the lease it gets. Every rule of the claim is written here once; the
-- TypeScript side (leases/claim.ts) only calls it, through
-- meshwork_claim_batch (claim-batch.sql).
--
-- Leases up to `max_tasks` tasks to `worker`, as many as fit what it has
-- free: for every resource a task asks (tasks.resources, `slots` always),
-- the worker's capacity (meshwork_capacity: `slots` is its
-- max_concurrency, or `concurrency` when not null) less what its live
-- leases hold (scheduling/sql/resources.sql). Nothing for a drained or
-- unknown worker. A worker of the REST contract states its concurrency in
-- each claim (POST /tasks/claim).
--
-- Claimable: PENDING past its not_before, or leased with an expired lease
-- (live-lease.sql) and attempts left (taken at once, without waiting for
-- the sweeper; one out of attempts is left to the sweeper to FAIL); a
-- worker it fits (match.sql); its concurrency_key under its limit and a
-- token in its rate_key's bucket (scheduling/sql/limits.sql).
--
-- Order (each source in turn, until max_tasks are taken or the worker is
-- full):
--  1. The task the worker is reserved for, if it fits now. Else what it
--     asks is held back: smaller tasks get only what it leaves.
--  2. Tasks with an expired lease, oldest expiry first.
--  3. `plan`, when given (leases/claim.ts, from the share book
--     scheduling/book.ts): {"shares": [...], "seq": [...]}, the picks of a
--     water-filling over the shares furthest below their entitlement, as
--     indexes into `shares`: each pick takes the next task of its share
--     that fits, in the share's own order (highest priority, then earliest
--     deadline, none last, then oldest). A worker that fits only a few
--     tasks takes the first picks: the shares furthest below first.
--  4. Every share, in that same order (work-conserving: what the plan's
--     shares could not use goes to anyone's tasks).
-- A task whose preferences (selectors.sql) the worker meets less than
-- fully is taken after the others this claim examined, best score first.
-- Rows come back in the order taken.
--
-- No starvation of large tasks: with `reserve_after_ms` (leases/claim.ts
-- passes it at most once a second per worker), a task that fits the
-- worker's whole capacity but not what it has free after this claim, and
-- has been claimable that long, is reserved on the worker
-- (workers.reserved_task_id; one per worker, one worker per task): from
-- then on the worker's claims hold back what it asks (step 1), so smaller
-- tasks get only what it leaves, and the first claim it fits takes it.
--
-- Plan decisions, each measured here:
-- * A function, so that its plans are pinned. With parameters (or
--   statistics that do not know a new workload yet) the planner estimated
--   one matching row and chose a bitmap scan of every PENDING task plus a
--   sort: each claim cost O(backlog), 10 ms at 20,000 pending tasks. With
--   sorts and bitmap scans priced out, each source walks its index
--   (tasks_ready_idx, tasks_share_claim_idx, tasks_lease_expiry_idx) in
--   claim order and stops when the claim is full. The first two hold only
--   tasks with no dependency pending: a claim of 32 behind 20,000 tasks
--   waiting for a dependency, which stepped over each of them, went from
--   p50 24.8 ms to 9.3 ms (8.1 ms with none waiting).
-- * A plan's share is read through tasks_share_claim_idx, by a range of one
--   share (`share >= s AND share <= s`). With `share = s` the share is a
--   constant of the scan, tasks_ready_idx gives the same order, and on a
--   table without statistics (autovacuum off, a fresh burst) the planner
--   chose it: each share of the plan walked the ready tasks of every other
--   share to find its own (7,700 entries for 8 rows, 5 ms per share, at
--   20,000 tasks in 1,000 shares), and the plan stayed cached.
-- * Sequential scans are off too. The claim's plans are cached for the life
--   of a connection (plpgsql keeps a generic plan after a few runs).
--   Planned while the tasks table was small, a scan became sequential,
--   kept as the table grew to a million rows (179 ms per claim, every row
--   read). With it off, every statement here has its index, whatever the
--   table's size and statistics were when it was planned
--   (test/postgres/claim-plan.test.ts).
-- * Cursors fetched one row at a time, each source FOR UPDATE SKIP LOCKED:
--   concurrent claimers take disjoint rows and never wait for each other
--   or for a transaction holding a task; a row is locked only once fetched,
--   and a source stops being read as soon as the claim is full. A task that
--   cannot fit what the worker has free when the claim starts is filtered
--   in the scan, never locked (another worker may take it meanwhile).
-- * The grant (grant.sql) reaches the picked rows by primary key
--   (`id = ANY(array)`), never by a join: on a table without fresh
--   statistics (autovacuum off, or right after a burst of writes) `UPDATE
--   ... FROM picked` became a hash join over a bitmap of every PENDING row,
--   116,780 index entries read per claim at 100,000 pending tasks (p50 30
--   ms instead of 5.8 ms at 10,000).
-- * No JIT: the sorts priced out above make the few unavoidable sorts of
--   tiny sets look expensive, and past jit_above_cost PostgreSQL compiled
--   the statement: 1.1 s per claim.
-- * A claim examines at most 8 × max_tasks + 32 candidates: a worker whose
--   tasks are held by limits does not walk the whole backlog each time.
-- * Expired leases are looked for from `expired_from` on, when given: the
--   database time when the coordinator's sweeper began its last pass that
--   left no expired lease behind (leases/store.ts). An entry of
--   tasks_lease_expiry_idx stays until a vacuum removes it, and while a
--   transaction is held open none can be: every lease granted since then,
--   completed or not, leaves one that expires in turn, and a claim walked
--   each of them to learn that none was live. A live lease that expired
--   before `expired_from` and is still there (the sweeper skipped it while
--   another transaction held it) is the sweeper's at its next whole pass
--   (once a minute: leases/sweeper.ts).
-- * PENDING tasks are looked for first from `ready_*`, when given: the
--   claim-order key (priority, deadline, created_at; ties by id, which is
--   time-ordered, so that tasks made in the same millisecond go in the
--   order they were made) of the first ready
--   task that is due, found once by the batch the claim is part of, from
--   the hint of the batch before when it can (claim-batch.sql).
--   The head of tasks_ready_idx holds an entry for every task claimed
--   since the last vacuum, and while a transaction is held open none can
--   be removed: each claim of a batch walked all of them. From the key
--   on, within its priority and deadline, the walk starts past them; when
--   that runs out, the claim walks from the head as before (source 4).
DROP FUNCTION IF EXISTS meshwork_claim(uuid, text[], jsonb, int, int, jsonb, int);
DROP FUNCTION IF EXISTS meshwork_claim(uuid, text[], jsonb, int, int, jsonb, int, timestamptz);
DROP FUNCTION IF EXISTS meshwork_claim(uuid, text[], jsonb, int, int, jsonb, int, timestamptz, int, timestamptz, timestamptz);
CREATE OR REPLACE FUNCTION meshwork_claim(
  worker uuid, caps text[], labels jsonb, max_tasks int, concurrency int,
  plan jsonb DEFAULT NULL, reserve_after_ms int DEFAULT NULL,
  expired_from timestamptz DEFAULT NULL, ready_priority int DEFAULT NULL,
  ready_deadline timestamptz DEFAULT NULL, ready_created timestamptz DEFAULT NULL,
  slots_held bigint DEFAULT NULL)
RETURNS SETOF tasks
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
  w workers;
  total jsonb;                -- what the worker offers
  free jsonb;                 -- what it has free for the next task
  scan_free jsonb;            -- `free` when a source is opened: its scan filter
  after jsonb;                -- `free` once a candidate is taken
  room int := max_tasks;      -- tasks still to take
  budget int := 8 * max_tasks + 32;
  picked uuid[] := '{}';
  seen uuid[] := '{}';        -- examined: a later source skips them
  deferred uuid[] := '{}';    -- preferences met less than fully: taken last
  held jsonb := '{}';         -- concurrency key → tasks taken here, not granted yet
  reserved uuid;
  reserved_ask jsonb;
  cur refcursor;
  c tasks;
  phase text := 'expired';    -- expired, plan, from, all, deferred
  phase_cur refcursor;        -- the cursor of the phase (not the plan's)
  share_curs refcursor[] := '{}';  -- the plan's cursors, by share
  share_done boolean[] := '{}';
  share_at int;
  share_name text;
  step int := 0;              -- the plan's pick being served
BEGIN
  -- One claim or placement at a time per worker (placement takes the same
  -- lock): what it has free is counted after the lock, so concurrent
  -- claims on any replicas cannot over-commit it.
  SELECT * INTO w FROM workers x WHERE x.id = worker AND NOT x.drained FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  total := meshwork_capacity(w, concurrency);
  -- A worker that offers nothing but slots needs only its slots counted
  -- (`slots_held`, when the caller counted them under the same lock).
  free := CASE WHEN w.capacity = '{}'::jsonb
    THEN jsonb_build_object('slots', (total->>'slots')::bigint - coalesce(slots_held, meshwork_slots_held(worker)))
    ELSE meshwork_minus(total, meshwork_allocated(worker)) END;
  IF (free->>'slots')::bigint < 1 THEN
    RETURN;
  END IF;

  -- 1. The reserved task: taken if it fits, else what it asks is held back.
  -- A reservation that no longer applies (taken, cancelled, waiting for a
  -- dependency again after a rerun, no longer fitting the worker at all,
  -- held back by a limit) is dropped.
  IF w.reserved_task_id IS NOT NULL THEN
    SELECT t.resources INTO reserved_ask FROM tasks t
      WHERE t.id = w.reserved_task_id AND t.state = 'PENDING' AND t.dependencies_pending = 0
        AND meshwork_claim_matches(t, caps, labels) AND meshwork_fits_in(t.resources, total)
        AND NOT meshwork_limits_hold(t.id, t.concurrency_key, t.rate_key);
    IF FOUND THEN
      reserved := w.reserved_task_id;
      seen := ARRAY[reserved];
      SELECT t.* INTO c FROM tasks t
        WHERE t.id = reserved AND t.state = 'PENDING' AND (t.not_before IS NULL OR t.not_before <= now())
        FOR UPDATE OF t SKIP LOCKED;
      IF FOUND AND meshwork_fits_in(c.resources, free)
          AND meshwork_limits_take(c.id, c.concurrency_key, c.rate_key, false) IS NULL THEN
        picked := ARRAY[c.id];
        room := room - 1;
        free := meshwork_minus(free, c.resources);
        IF c.concurrency_key <> '' THEN
          held := jsonb_build_object(c.concurrency_key, 1);
        END IF;
        reserved := NULL;
        UPDATE workers x SET reserved_task_id = NULL, reserved_at = NULL WHERE x.id = worker;
      ELSE
        free := meshwork_minus(free, reserved_ask);
      END IF;
    ELSE
      UPDATE workers x SET reserved_task_id = NULL, reserved_at = NULL WHERE x.id = worker;
    END IF;
  END IF;

  -- 2–4, and last the deferred: one candidate at a time, from the source
  -- the phase names. A cursor is opened when its source is first read and
  -- closed when the source is used up or the claim is done.
  LOOP
    EXIT WHEN room <= 0 OR (free->>'slots')::bigint < 1;
    -- Examined enough: what was deferred is all that is left to take.
    IF budget <= 0 AND phase <> 'deferred' THEN
      IF phase_cur IS NOT NULL THEN
        CLOSE phase_cur;
        phase_cur := NULL;
      END IF;
      phase := 'deferred';
    END IF;
    IF phase = 'plan' AND (plan IS NULL OR step >= jsonb_array_length(plan->'seq')) THEN
      phase := CASE WHEN ready_created IS NULL THEN 'all' ELSE 'from' END;
    END IF;
    IF phase = 'deferred' AND cardinality(deferred) = 0 THEN
      EXIT;
    END IF;
    -- The cursor of this phase (and, for the plan, of this step's share).
    IF phase = 'plan' THEN
      share_at := (plan->'seq'->>step)::int + 1;
      IF share_done[share_at] THEN
        step := step + 1;
        CONTINUE;
      END IF;
      cur := share_curs[share_at];
    ELSE
      cur := phase_cur;
    END IF;
    IF cur IS NULL THEN
      scan_free := free;
      IF phase = 'expired' THEN
        OPEN cur FOR SELECT t.* FROM tasks t
          WHERE meshwork_lease_expired(t)
            AND t.lease_expires_at >= coalesce(expired_from, '-infinity')
            AND t.failures < t.max_attempts
            AND meshwork_claim_matches(t, caps, labels)
            AND (t.resources = '{"slots": 1}' OR meshwork_fits_in(t.resources, scan_free))
          -- Oldest expiry first, as tasks_lease_expiry_idx stores it.
          ORDER BY t.lease_expires_at
          FOR UPDATE OF t SKIP LOCKED;
      ELSIF phase = 'plan' THEN
        share_name := plan->'shares'->>(share_at - 1);
        -- The share as a range of one, not `t.share = share_name`: an
        -- equality makes the share a constant, and tasks_ready_idx then
        -- gives the same order (see the plan decisions above).
        OPEN cur FOR SELECT t.* FROM tasks t
          WHERE t.state = 'PENDING' AND t.dependencies_pending = 0
            AND t.share >= share_name AND t.share <= share_name
            AND (t.not_before IS NULL OR t.not_before <= now())
            AND meshwork_claim_matches(t, caps, labels)
            AND (t.resources = '{"slots": 1}' OR meshwork_fits_in(t.resources, scan_free))
          -- The share's order, as tasks_share_claim_idx stores it.
          ORDER BY t.share, t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
          FOR UPDATE OF t SKIP LOCKED;
        share_curs[share_at] := cur;
      ELSIF phase = 'from' AND ready_deadline IS NULL THEN
        -- The first ready task's priority, without a deadline, from its age on.
        OPEN cur FOR SELECT t.* FROM tasks t
          WHERE t.state = 'PENDING' AND t.dependencies_pending = 0
            AND t.priority = ready_priority AND t.deadline IS NULL
            AND t.created_at >= ready_created
            AND (t.not_before IS NULL OR t.not_before <= now())
            AND meshwork_claim_matches(t, caps, labels)
            AND (t.resources = '{"slots": 1}' OR meshwork_fits_in(t.resources, scan_free))
          ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
          FOR UPDATE OF t SKIP LOCKED;
      ELSIF phase = 'from' THEN
        -- The first ready task's priority and deadline, from its age on.
        OPEN cur FOR SELECT t.* FROM tasks t
          WHERE t.state = 'PENDING' AND t.dependencies_pending = 0
            AND t.priority = ready_priority AND t.deadline = ready_deadline
            AND t.created_at >= ready_created
            AND (t.not_before IS NULL OR t.not_before <= now())
            AND meshwork_claim_matches(t, caps, labels)
            AND (t.resources = '{"slots": 1}' OR meshwork_fits_in(t.resources, scan_free))
          ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
          FOR UPDATE OF t SKIP LOCKED;
      ELSIF phase = 'all' THEN
        OPEN cur FOR SELECT t.* FROM tasks t
          WHERE t.state = 'PENDING' AND t.dependencies_pending = 0
            AND (t.not_before IS NULL OR t.not_before <= now())
            AND meshwork_claim_matches(t, caps, labels)
            AND (t.resources = '{"slots": 1}' OR meshwork_fits_in(t.resources, scan_free))
          -- The claim order, as tasks_ready_idx stores it.
          ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
          FOR UPDATE OF t SKIP LOCKED;
      ELSE
        -- Already locked by this claim; best score first.
        OPEN cur FOR SELECT t.* FROM tasks t
          WHERE t.id = ANY (deferred)
          ORDER BY meshwork_preference_score(t.preferences, labels) DESC,
            t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC;
      END IF;
      IF phase <> 'plan' THEN
        phase_cur := cur;
      END IF;
    END IF;
    FETCH cur INTO c;
    IF NOT FOUND THEN
      -- This source is used up: the next share of the plan, or the next phase.
      CLOSE cur;
      IF phase = 'plan' THEN
        share_done[share_at] := true;
        step := step + 1;
      ELSE
        phase_cur := NULL;
        phase := CASE phase WHEN 'expired' THEN 'plan' WHEN 'from' THEN 'all'
          WHEN 'all' THEN 'deferred' ELSE 'done' END;
        EXIT WHEN phase = 'done';
      END IF;
      CONTINUE;
    END IF;
    IF phase <> 'deferred' THEN
      CONTINUE WHEN c.id = ANY (seen);
      seen := seen || c.id;
      budget := budget - 1;
      -- A task whose preferences this worker meets only in part waits for
      -- the deferred phase (as many as the claim may take, no more: the
      -- rest are left to other workers).
      IF c.preferences <> '[]' AND cardinality(deferred) < room
          AND NOT meshwork_preferences_met(c.preferences, labels) THEN
        deferred := deferred || c.id;
        CONTINUE;
      END IF;
    END IF;
    -- What this claim took before may leave too little for it now.
    after := CASE WHEN c.resources = '{"slots": 1}'
      THEN free || jsonb_build_object('slots', (free->>'slots')::bigint - 1)
      ELSE meshwork_take(free, c.resources) END;
    CONTINUE WHEN after IS NULL OR (after->>'slots')::bigint < 0;
    CONTINUE WHEN (c.concurrency_key <> '' OR c.rate_key <> '')
      AND meshwork_limits_take(c.id, c.concurrency_key, c.rate_key, false,
        coalesce((held->>c.concurrency_key)::int, 0)) IS NOT NULL;
    IF c.concurrency_key <> '' THEN
      held := held || jsonb_build_object(c.concurrency_key, coalesce((held->>c.concurrency_key)::int, 0) + 1);
    END IF;
    picked := picked || c.id;
    room := room - 1;
    free := after;
    -- The plan's next step: the next pick of the water-filling, maybe another share.
    IF phase = 'plan' THEN
      step := step + 1;
    END IF;
  END LOOP;
  -- Cursors still open (the claim filled up first).
  IF phase_cur IS NOT NULL THEN
    CLOSE phase_cur;
  END IF;
  FOR i IN 1 .. coalesce(cardinality(share_curs), 0) LOOP
    IF share_curs[i] IS NOT NULL AND NOT coalesce(share_done[i], false) THEN
      cur := share_curs[i];
      CLOSE cur;
    END IF;
  END LOOP;

  -- A large task that keeps losing to smaller ones: reserve the worker for
  -- it. Looked for among the first 200 tasks the worker could run, best
  -- first (a bounded walk, whatever the backlog), in claim order from the
  -- first ready task's key (`ready_*`, as source 4 starts): its priority
  -- and deadline from its age on, the later deadlines of its priority,
  -- none last, then the lower priorities; from the head when no key is
  -- given. Each part is a range of tasks_ready_idx. Walked from the head
  -- each time, it read every entry the claims had left there behind a
  -- transaction held open, up to once a second per worker.
  IF reserve_after_ms IS NOT NULL AND reserved IS NULL AND w.reserved_task_id IS NULL THEN
    SELECT x.id, x.resources INTO reserved, reserved_ask FROM (
      (SELECT t.id, t.resources, t.not_before, t.created_at, t.concurrency_key, t.rate_key FROM tasks t
      WHERE ready_created IS NOT NULL AND ready_deadline IS NULL
        AND t.state = 'PENDING' AND t.dependencies_pending = 0
        AND t.priority = ready_priority AND t.deadline IS NULL AND t.created_at >= ready_created
        AND (t.not_before IS NULL OR t.not_before <= now())
        AND meshwork_claim_matches(t, caps, labels)
      ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
      LIMIT 200)
      UNION ALL
      (SELECT t.id, t.resources, t.not_before, t.created_at, t.concurrency_key, t.rate_key FROM tasks t
      WHERE ready_created IS NOT NULL AND ready_deadline IS NOT NULL
        AND t.state = 'PENDING' AND t.dependencies_pending = 0
        AND t.priority = ready_priority AND t.deadline = ready_deadline AND t.created_at >= ready_created
        AND (t.not_before IS NULL OR t.not_before <= now())
        AND meshwork_claim_matches(t, caps, labels)
      ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
      LIMIT 200)
      UNION ALL
      (SELECT t.id, t.resources, t.not_before, t.created_at, t.concurrency_key, t.rate_key FROM tasks t
      WHERE ready_created IS NOT NULL AND ready_deadline IS NOT NULL
        AND t.state = 'PENDING' AND t.dependencies_pending = 0
        AND t.priority = ready_priority AND t.deadline > ready_deadline
        AND (t.not_before IS NULL OR t.not_before <= now())
        AND meshwork_claim_matches(t, caps, labels)
      ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
      LIMIT 200)
      UNION ALL
      (SELECT t.id, t.resources, t.not_before, t.created_at, t.concurrency_key, t.rate_key FROM tasks t
      WHERE ready_created IS NOT NULL AND ready_deadline IS NOT NULL
        AND t.state = 'PENDING' AND t.dependencies_pending = 0
        AND t.priority = ready_priority AND t.deadline IS NULL
        AND (t.not_before IS NULL OR t.not_before <= now())
        AND meshwork_claim_matches(t, caps, labels)
      ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
      LIMIT 200)
      UNION ALL
      (SELECT t.id, t.resources, t.not_before, t.created_at, t.concurrency_key, t.rate_key FROM tasks t
      WHERE ready_created IS NOT NULL
        AND t.state = 'PENDING' AND t.dependencies_pending = 0
        AND t.priority < ready_priority
        AND (t.not_before IS NULL OR t.not_before <= now())
        AND meshwork_claim_matches(t, caps, labels)
      ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
      LIMIT 200)
      UNION ALL
      (SELECT t.id, t.resources, t.not_before, t.created_at, t.concurrency_key, t.rate_key FROM tasks t
      WHERE ready_created IS NULL
        AND t.state = 'PENDING' AND t.dependencies_pending = 0
        AND (t.not_before IS NULL OR t.not_before <= now())
        AND meshwork_claim_matches(t, caps, labels)
      ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
      LIMIT 200)
      LIMIT 200
    ) x
    WHERE x.resources <> '{"slots": 1}'
      AND NOT meshwork_fits_in(x.resources, free)
      AND meshwork_fits_in(x.resources, total)
      AND now() - coalesce(x.not_before, x.created_at) >= make_interval(secs => reserve_after_ms / 1000.0)
      AND NOT (x.id = ANY (picked))
      AND NOT EXISTS (SELECT 1 FROM workers o WHERE o.reserved_task_id = x.id)
      AND NOT meshwork_limits_hold(x.id, x.concurrency_key, x.rate_key)
    LIMIT 1;
    IF reserved IS NOT NULL THEN
      -- Another replica's claim may have reserved it since this one looked:
      -- workers_reserved_task_idx refuses the second, which goes without.
      BEGIN
        UPDATE workers x SET reserved_task_id = reserved, reserved_at = now() WHERE x.id = worker;
      EXCEPTION WHEN unique_violation THEN
        reserved := NULL;
      END;
    END IF;
  END IF;

  IF cardinality(picked) = 0 THEN
    RETURN;
  END IF;
  -- The lease granted by the one grant statement (grant.sql), RUNNING at
  -- once; the rows come back in the order taken.
  RETURN QUERY
    SELECT g.* FROM meshwork_grant(picked, worker, false) AS g
      JOIN unnest(picked) WITH ORDINALITY AS o(id, n) ON o.id = g.id
      ORDER BY o.n;
END;
$$;
