-- Resources, as jsonb maps of resource name → quantity: what a task asks
-- (tasks.resources, which always holds `slots`), what a worker offers
-- (meshwork_capacity) and what its live leases hold (meshwork_allocated).
-- A task fits a worker when, for every resource it asks, the worker has at
-- least that much free (meshwork_fits_in); a resource the worker does not
-- offer is free 0. The claim (leases/sql/claim.sql), push placement
-- (tasks/placement.ts) and the waiting reasons (scheduling/why.ts) use
-- these, and no other arithmetic of resources.

-- The slots a worker without a limit (max_concurrency 0) offers: more than
-- any number of leases.
CREATE OR REPLACE FUNCTION meshwork_unlimited_slots() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT 2000000000::bigint $$;

-- What a worker offers: its stated capacity (cpu and memory filled in
-- from cpu_count and memory_mb at registration) and `slots`, its
-- max_concurrency, or `concurrency` when a claim states its own (REST
-- workers do), 0 meaning no limit.
CREATE OR REPLACE FUNCTION meshwork_capacity(w workers, concurrency int DEFAULT NULL) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT w.capacity || jsonb_build_object('slots',
    CASE WHEN coalesce(concurrency, w.max_concurrency) = 0 THEN meshwork_unlimited_slots()
      ELSE coalesce(concurrency, w.max_concurrency)::bigint END)
$$;

-- What a worker's live leases hold (live-lease.sql), summed per resource;
-- `except_task` leaves out a task being re-placed. One range of
-- tasks_lease_worker_expiry_idx, as meshwork_live_leases.
--
-- These counts are plpgsql, not SQL functions: a SQL function whose body
-- reads a table is not inlined, and PostgreSQL (before 18) plans its body
-- again at every statement that calls it (meshwork_slots_held: 141 µs a
-- call over 2,000 claims, twice per claim, a third of a claim of one
-- task); plpgsql plans it once per connection (15 µs a call). The plan
-- kept is made with sequential and bitmap scans off (the function's own
-- settings, about 1 µs a call), so that it is an index scan whoever called
-- first and however small the table was then (claim.sql says why), never a
-- read of the whole table.
CREATE OR REPLACE FUNCTION meshwork_allocated(worker uuid, except_task uuid DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
  RETURN (SELECT coalesce(jsonb_object_agg(r.key, r.total), '{}'::jsonb)
    FROM (
      SELECT e.key, sum(e.value::bigint) AS total
      FROM tasks t, jsonb_each_text(t.resources) AS e
      WHERE meshwork_lease_live_on(t, worker)
        AND t.id IS DISTINCT FROM except_task
      GROUP BY e.key
    ) r);
END;
$$;

-- The slots a worker's live leases hold: what a claim's answer reports and
-- all a worker that offers nothing but slots needs (cheaper than the whole
-- map of meshwork_allocated). One range of tasks_lease_worker_expiry_idx;
-- plpgsql, as meshwork_allocated.
CREATE OR REPLACE FUNCTION meshwork_slots_held(worker uuid) RETURNS bigint
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
  RETURN (SELECT coalesce(sum((t.resources->>'slots')::bigint), 0) FROM tasks t
    WHERE meshwork_lease_live_on(t, worker));
END;
$$;

-- `have` less `used`, per resource of `have` (below 0 where leases hold
-- more than a worker now offers: its capacity shrank under them).
CREATE OR REPLACE FUNCTION meshwork_minus(have jsonb, used jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce(jsonb_object_agg(h.key, h.value::bigint - coalesce((used->>h.key)::bigint, 0)), '{}'::jsonb)
  FROM jsonb_each_text(have) AS h
$$;

-- Whether `ask` fits in `free`: every resource asked at most what is free.
CREATE OR REPLACE FUNCTION meshwork_fits_in(ask jsonb, free jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT NOT EXISTS (
    SELECT 1 FROM jsonb_each_text(ask) AS a
    WHERE a.value::bigint > coalesce((free->>a.key)::bigint, 0))
$$;

-- `free` less `ask` when `ask` fits in it (meshwork_fits_in), else NULL:
-- the claim's one step per task it takes.
-- Written out rather than calling the two (the claim runs it per task
-- taken, and a call of a SQL function that is not inlined costs).
CREATE OR REPLACE FUNCTION meshwork_take(free jsonb, ask jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN EXISTS (
      SELECT 1 FROM jsonb_each_text(ask) AS a
      WHERE a.value::bigint > coalesce((free->>a.key)::bigint, 0))
    THEN NULL
    ELSE (SELECT jsonb_object_agg(f.key, f.value::bigint - coalesce((ask->>f.key)::bigint, 0))
      FROM jsonb_each_text(free) AS f)
  END
$$;

-- What a worker has free for `t` (or for any task, `t` null): its capacity
-- less its live leases (but `t`'s own, when re-placed), less the resources
-- of the task it is reserved for unless that is `t` (a smaller task gets
-- only what the reserved one leaves).
CREATE OR REPLACE FUNCTION meshwork_free(w workers, t_id uuid DEFAULT NULL, concurrency int DEFAULT NULL) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT meshwork_minus(
    meshwork_minus(meshwork_capacity(w, concurrency), meshwork_allocated(w.id, t_id)),
    coalesce((SELECT r.resources FROM tasks r
      WHERE r.id = w.reserved_task_id AND r.state = 'PENDING' AND r.id IS DISTINCT FROM t_id), '{}'::jsonb))
$$;
