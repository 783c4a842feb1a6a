-- A task's history and the ready counts that wake long polls, written by
-- the two statement-level triggers on tasks (tasks_events_on_insert and
-- tasks_events_on_update, created in migration 0013), so that every path
-- that changes a task (CreateTask, the claim and its grant, placement, the
-- sweeper, cancel, retry, any replica) records it in the same transaction.
--
-- Statement-level, with transition tables: a CreateTasks of 1,000 or a
-- claim of 32 writes its events with one INSERT … SELECT, not one trigger
-- call per row. An update records an event only when the state, the
-- attempt or the lease holder changed (not for renewals or progress). An
-- event carries the task's error only where the change is the error's
-- (back to PENDING for a retry or after an expiry, FAILED, CANCELED): a new
-- attempt does not repeat the last one's.
--
-- Long polls are woken by how many tasks became claimable, per workload,
-- not all at once: NOTIFY meshwork_task_ready carries a JSON object of
-- workload → count ({"render":500}), and each replica wakes about that many
-- of its parked claims that can take them (src/leases/wakeup.ts). A burst of
-- 500 new tasks used to wake every parked poll (2,000 claims for 500 tasks).
-- A task that goes back to PENDING counts once its not_before has passed;
-- until then the sweeper wakes claims for it when it falls due. A lease of
-- a task with a concurrency_key that ends counts too: it frees a place
-- under the key's limit (scheduling/sql/limits.sql) for a task of the same
-- kind, which a parked claim may now take.
--
-- Both move the ready epoch (claim-batch.sql) when a task may have become
-- ready ahead of the first ready one: created with a priority or a
-- deadline, back to PENDING, or released by its dependencies.

-- Deleted tasks (retention): their events with them, one statement for
-- all (the trigger tasks_events_on_delete, migration 0023). task_events
-- has no foreign key to tasks: its check cost a lookup and a row lock in
-- tasks for every event the two triggers below write. Only these triggers
-- and a delivery's record (fleet/dispatch-store.ts, which locks its task
-- first) write events, always of a task that exists.
CREATE OR REPLACE FUNCTION meshwork_task_events_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM task_events WHERE task_id = ANY (ARRAY(SELECT id FROM old_rows));
  RETURN NULL;
END;
$$;

-- Sends the ready counts. A payload too long for NOTIFY (over ~7,900 bytes,
-- counted in bytes: very many or very long workload names at once) is sent
-- empty, which wakes every parked claim. plpgsql: a SQL function called by
-- PERFORM is planned again at each call (23 µs against 3.5 µs, measured
-- over 2,000 claims and completions: three calls each).
CREATE OR REPLACE FUNCTION meshwork_notify_ready(ready text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF ready IS NOT NULL THEN
    PERFORM pg_notify('meshwork_task_ready',
      CASE WHEN octet_length(ready) <= 7900 THEN ready ELSE '' END);
  END IF;
END;
$$;

-- New tasks: an event each, and the ready counts of those claimable now.
CREATE OR REPLACE FUNCTION meshwork_task_events_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO task_events (task_id, state, attempt, worker_id, error_code, error_message)
  SELECT n.id, n.state, n.attempt, coalesce(n.lease_worker_id, n.assigned_worker_id),
    n.error_code, n.error_message
  FROM new_rows n;
  PERFORM meshwork_notify_ready((
    SELECT json_object_agg(c.workload, c.n)::text
    FROM (SELECT workload, count(*) AS n FROM new_rows
      WHERE state = 'PENDING' AND (not_before IS NULL OR not_before <= now())
      GROUP BY workload) c));
  -- A new task of priority 0 without a deadline comes after every ready
  -- one (claim-batch.sql, hint); any other may come ahead.
  IF EXISTS (SELECT 1 FROM new_rows
      WHERE state = 'PENDING' AND (priority <> 0 OR deadline IS NOT NULL)) THEN
    PERFORM nextval('meshwork_ready_epoch');
  END IF;
  RETURN NULL;
END;
$$;

-- Changed tasks: one pass over the changed rows, their history, then the
-- ready counts of those that came back to PENDING and are claimable now (or
-- were released: their dependencies finished, dependencies.sql), and the
-- dependents of those that finished or were reopened (dependencies.sql).
CREATE OR REPLACE FUNCTION meshwork_task_events_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  ready text;
  finished uuid[];
  reopened uuid[];
  ahead boolean;
BEGIN
  WITH changed AS (
    SELECT n.id, n.state, n.attempt, n.workload, n.not_before, o.state AS old_state,
      o.not_before AS old_not_before, n.concurrency_key,
      o.state IS DISTINCT FROM n.state
        OR o.attempt IS DISTINCT FROM n.attempt
        OR o.lease_worker_id IS DISTINCT FROM n.lease_worker_id AS is_event,
      coalesce(n.lease_worker_id, n.assigned_worker_id) AS worker_id,
      CASE WHEN n.state IN ('PENDING', 'FAILED', 'CANCELED') THEN n.error_code ELSE '' END AS error_code,
      CASE WHEN n.state IN ('PENDING', 'FAILED', 'CANCELED') THEN n.error_message ELSE '' END AS error_message
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.state IS DISTINCT FROM n.state
      OR o.attempt IS DISTINCT FROM n.attempt
      OR o.lease_worker_id IS DISTINCT FROM n.lease_worker_id
      OR (n.state = 'PENDING' AND o.not_before IS DISTINCT FROM n.not_before)
  ), recorded AS (
    INSERT INTO task_events (task_id, state, attempt, worker_id, error_code, error_message)
    SELECT id, state, attempt, worker_id, error_code, error_message FROM changed WHERE is_event
  )
  SELECT
    (SELECT json_object_agg(c.workload, c.n)::text FROM (
      SELECT workload, count(*) AS n FROM changed
      WHERE (state = 'PENDING' AND (not_before IS NULL OR not_before <= now())
          AND (old_state IS DISTINCT FROM 'PENDING' OR old_not_before > now()))
        OR (concurrency_key <> '' AND old_state IN ('ASSIGNED', 'RUNNING')
          AND state NOT IN ('ASSIGNED', 'RUNNING'))
      GROUP BY workload) c),
    ARRAY(SELECT id FROM changed
      WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELED')
        AND old_state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED')),
    ARRAY(SELECT id FROM changed
      WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED')
        AND old_state IN ('SUCCEEDED', 'FAILED', 'CANCELED')),
    -- Back to PENDING, or released (its not_before moved): it keeps its
    -- place in the claim order, maybe ahead of the first ready task.
    EXISTS (SELECT 1 FROM changed
      WHERE state = 'PENDING'
        AND (old_state IS DISTINCT FROM 'PENDING' OR old_not_before IS DISTINCT FROM not_before))
  INTO ready, finished, reopened, ahead;
  PERFORM meshwork_notify_ready(ready);
  IF ahead THEN
    PERFORM nextval('meshwork_ready_epoch');
  END IF;
  IF cardinality(finished) > 0 OR cardinality(reopened) > 0 THEN
    PERFORM meshwork_dependencies_settle(finished, reopened);
  END IF;
  RETURN NULL;
END;
$$;
