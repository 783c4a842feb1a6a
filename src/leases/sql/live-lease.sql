-- A live lease, defined once: a task ASSIGNED or RUNNING whose lease has not
-- expired by the database clock. Everything that asks whether a lease is
-- live reads it from here: the claim (an expired lease may be taken over),
-- the lease check of every lease-bound request (meshwork_lease_held and
-- meshwork_lease_verdict below, through core/lease-check.ts), a worker's slot count
-- (meshwork_live_leases) and the sweeper's expiry (leases/sql/expire.ts).
-- The boundary is here and only here: live while expires_at > now(),
-- expired from expires_at on.
--
-- Plain SQL functions of the row, so that the planner inlines them: the
-- state literals reach the partial indexes (tasks_lease_expiry_idx,
-- tasks_lease_worker_expiry_idx, `where state in ('ASSIGNED', 'RUNNING')`)
-- as if written in place, and `lease_expires_at > now()` bounds the range.
CREATE OR REPLACE FUNCTION meshwork_lease_live(t tasks) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT t.state IN ('ASSIGNED', 'RUNNING') AND t.lease_expires_at > now()
$$;

-- The other half of the same rule: a leased task whose lease ran out.
CREATE OR REPLACE FUNCTION meshwork_lease_expired(t tasks) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT t.state IN ('ASSIGNED', 'RUNNING') AND t.lease_expires_at <= now()
$$;

-- The same rule for one worker's leases, written so that only
-- tasks_lease_worker_expiry_idx can serve it: the row comparison is
-- `lease_expires_at > now()` for this worker's rows, and starts the walk at
-- (worker, now()), past the entries of its leases that ran out;
-- tasks_lease_expiry_idx, which leads with the expiry, cannot take it.
-- Planned on a small table with the plain comparison, the counts below
-- chose that index and read the live leases of every worker (60,000 in
-- test/postgres/claim-plan.test.ts).
CREATE OR REPLACE FUNCTION meshwork_lease_live_on(t tasks, worker uuid) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT t.state IN ('ASSIGNED', 'RUNNING') AND t.lease_worker_id = worker
    AND (t.lease_worker_id, t.lease_expires_at) > (worker, now())
$$;

-- The live leases a worker holds, pulled or pushed. `except_task` leaves
-- out a task being re-placed. One range of tasks_lease_worker_expiry_idx,
-- this worker's leases expiring after now(): the entries of leases that ran
-- out (dead versions a vacuum has not removed yet, every one since a
-- transaction held open began) are never read. plpgsql, planned once per
-- connection, with an index scan (the counts of
-- scheduling/sql/resources.sql say why).
CREATE OR REPLACE FUNCTION meshwork_live_leases(worker uuid, except_task uuid DEFAULT NULL) RETURNS int
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
  RETURN (SELECT count(*)::int FROM tasks t
    WHERE meshwork_lease_live_on(t, worker)
      AND t.id IS DISTINCT FROM except_task);
END;
$$;

-- The lease check: whether the request (attempt, worker, token; token ''
-- when none was sent) holds the lease on `t`. A plain AND of column tests,
-- so that a statement's planner sees them as such: completing a batch of
-- 32 by `tasks.id = v.id AND meshwork_lease_verdict(...) IS NULL` (one
-- opaque CASE) was planned as a hash join over a sequential scan of every
-- task, 12 ms per CompleteTasks at 30,000 rows instead of 2.4 ms by the
-- primary key. Every lease-bound UPDATE has it in its WHERE, so a refused
-- request changes nothing.
--
-- The live test and the worker test are `IS TRUE`, which no index can
-- serve: every caller names the task, and must reach it by primary key.
-- As plain tests, `lease_worker_id = worker AND lease_expires_at > now()`
-- matched tasks_lease_worker_expiry_idx and `lease_expires_at > now()`
-- tasks_lease_expiry_idx, and on a table without statistics a completion
-- of 32 was planned over the worker's live leases, or every worker's: all
-- of them read per statement, and behind a transaction held open every
-- lease granted in the last lease_seconds (test/postgres/lease-plan.test.ts).
CREATE OR REPLACE FUNCTION meshwork_lease_held(t tasks, attempt int, worker uuid, token text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT meshwork_lease_live(t) IS TRUE
     AND t.attempt = attempt
     AND (t.lease_worker_id = worker) IS TRUE
     AND (token = '' OR t.lease_token = token)
$$;

-- Why a request does not hold the lease on `t` (meshwork_lease_held), or
-- NULL when it does: the reason a client is told (core/lease-check.ts
-- words it), judged in this order: TASK_CANCELED, STALE_ATTEMPT,
-- FOREIGN_WORKER, LEASE_EXPIRED (a PENDING task the sweeper took back from
-- this attempt), TIMEOUT (the sweeper failed this attempt for running past
-- the task's timeout_seconds) or NOT_LEASED (any other state without a lease),
-- TOKEN_MISMATCH, LEASE_EXPIRED (leased, not live). COMPLETED when this
-- attempt of this worker already succeeded: a completion sent again is
-- judged by its manifest (leases/store.ts); to any other request it holds
-- no lease. The read that explains a refusal gets its reason here.
CREATE OR REPLACE FUNCTION meshwork_lease_verdict(t tasks, attempt int, worker uuid, token text) RETURNS text
LANGUAGE sql STABLE
AS $$
  SELECT CASE
    WHEN meshwork_lease_held(t, attempt, worker, token) THEN NULL
    WHEN t.state = 'SUCCEEDED' AND t.attempt = attempt AND t.lease_worker_id = worker THEN 'COMPLETED'
    WHEN t.state = 'CANCELED' THEN 'TASK_CANCELED'
    WHEN t.attempt IS DISTINCT FROM attempt THEN 'STALE_ATTEMPT'
    WHEN t.lease_worker_id IS DISTINCT FROM worker THEN 'FOREIGN_WORKER'
    WHEN t.state NOT IN ('ASSIGNED', 'RUNNING') THEN
      CASE WHEN t.state = 'PENDING' AND t.error_code = 'LEASE_EXPIRED' THEN 'LEASE_EXPIRED'
        WHEN t.state IN ('PENDING', 'FAILED') AND t.error_code = 'TIMEOUT' THEN 'TIMEOUT'
        ELSE 'NOT_LEASED' END
    WHEN token IS DISTINCT FROM '' AND t.lease_token IS DISTINCT FROM token THEN 'TOKEN_MISMATCH'
    ELSE 'LEASE_EXPIRED'
  END
$$;

-- What a task records (error_code LEASE_EXPIRED) when its lease on
-- `attempt` ran out: written by the sweeper's expiry and by a claim that
-- takes the task over, in these words only.
CREATE OR REPLACE FUNCTION meshwork_expiry_message(attempt int) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
  SELECT 'the lease on attempt ' || attempt::text || ' expired'
$$;
