-- Dependencies between tasks (CreateTaskRequest.depends_on): a task waits,
-- PENDING with not_before = 'infinity' (no claim, placement or wake-up sees
-- it), while dependencies_pending > 0. The task-history trigger of tasks
-- (history.sql) calls meshwork_dependencies_settle for every statement
-- that finishes tasks or reopens finished ones (a rerun), whatever path
-- made the change: a completion, a failure, an expiry, a timeout, a
-- deadline, a cancel, on any replica, in the same transaction.
--
-- Counts move by relative updates (pending - n, pending + n) so that two
-- dependencies finishing at once in two transactions both count: the
-- second UPDATE waits for the first's row lock and applies its change to
-- the row the first left (READ COMMITTED re-reads it). A create that names
-- existing tasks locks them FOR SHARE first (tasks/create.ts), so that a
-- dependency cannot finish unseen between the create's read and its commit.

-- Fails, with DEPENDENCY_FAILED, the PENDING tasks that wait under
-- DEPENDENCY_POLICY_ALL_SUCCEEDED for any of `failed` (tasks that FAILED or
-- were CANCELED), and theirs in turn down the graph, in one statement (a
-- chain of 1,000 is not 1,000 nested trigger calls). The tasks it fails
-- settle their ALL_DONE dependents through the trigger.
CREATE OR REPLACE FUNCTION meshwork_dependencies_fail(failed uuid[]) RETURNS void
LANGUAGE sql AS $$
  WITH RECURSIVE doomed(id, cause) AS (
    SELECT d.task_id, d.depends_on
    FROM task_dependencies d JOIN tasks t ON t.id = d.task_id
    WHERE d.depends_on = ANY(failed)
      AND t.state = 'PENDING' AND t.dependency_policy = 'ALL_SUCCEEDED'
    UNION
    SELECT d.task_id, d.depends_on
    FROM doomed x
      JOIN task_dependencies d ON d.depends_on = x.id
      JOIN tasks t ON t.id = d.task_id
    WHERE t.state = 'PENDING' AND t.dependency_policy = 'ALL_SUCCEEDED'
  ), first AS (
    SELECT DISTINCT ON (id) id, cause FROM doomed ORDER BY id, cause
  )
  UPDATE tasks t SET
    state = 'FAILED',
    error_code = 'DEPENDENCY_FAILED',
    error_message = 'dependency ' || f.cause::text || ' did not succeed',
    finished_at = now(),
    updated_at = now()
  FROM first f
  WHERE t.id = f.id AND t.state = 'PENDING'
$$;

-- Settles the dependents of tasks that just finished (`finished`) or were
-- just reopened (`reopened`: a rerun puts a finished task back to PENDING).
-- A finished dependency that did not succeed fails its ALL_SUCCEEDED
-- dependents; then each PENDING dependent counts it as done, and the one
-- whose count reaches 0 becomes claimable at its run_at (now when none).
-- A reopened dependency counts as not done again: a PENDING dependent waits
-- for it again (its FAILED dependents stay FAILED unless rerun with it).
CREATE OR REPLACE FUNCTION meshwork_dependencies_settle(finished uuid[], reopened uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF cardinality(finished) > 0
    AND EXISTS (SELECT 1 FROM task_dependencies WHERE depends_on = ANY(finished)) THEN
    PERFORM meshwork_dependencies_fail(ARRAY(
      SELECT id FROM tasks WHERE id = ANY(finished) AND state IN ('FAILED', 'CANCELED')));
    UPDATE tasks t SET
      dependencies_pending = greatest(t.dependencies_pending - c.n, 0),
      not_before = CASE WHEN t.dependencies_pending - c.n <= 0 THEN t.run_at ELSE t.not_before END,
      updated_at = now()
    FROM (
      SELECT task_id, count(*)::int AS n FROM task_dependencies
      WHERE depends_on = ANY(finished) GROUP BY task_id
    ) c
    WHERE t.id = c.task_id AND t.state = 'PENDING';
  END IF;
  IF cardinality(reopened) > 0
    AND EXISTS (SELECT 1 FROM task_dependencies WHERE depends_on = ANY(reopened)) THEN
    UPDATE tasks t SET
      dependencies_pending = t.dependencies_pending + c.n,
      not_before = 'infinity',
      updated_at = now()
    FROM (
      SELECT task_id, count(*)::int AS n FROM task_dependencies
      WHERE depends_on = ANY(reopened) GROUP BY task_id
    ) c
    WHERE t.id = c.task_id AND t.state = 'PENDING';
  END IF;
END;
$$;

-- Recounts the dependencies of tasks just put back to PENDING by a rerun
-- (`ids`): each waits again for those not finished (not_before 'infinity'),
-- or is claimable now; one whose ALL_SUCCEEDED dependency FAILED or was
-- CANCELED fails again at once (DEPENDENCY_FAILED). A dependency deleted
-- by retention counts as finished. The dependencies are locked FOR SHARE
-- first, as a create locks them: one that is finishing in another
-- transaction is waited for, and the count (a statement of its own, with a
-- snapshot taken after the lock) sees it finished; none can finish unseen
-- until this transaction commits (its trigger would find these tasks still
-- FAILED and leave their count as it was). Like a create, a rerun task is
-- not claimable before its run_at.
CREATE OR REPLACE FUNCTION meshwork_dependencies_reset(ids uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM tasks
    WHERE id IN (SELECT depends_on FROM task_dependencies WHERE task_id = ANY(ids))
    ORDER BY id FOR SHARE;
  UPDATE tasks t SET
    dependencies_pending = c.n,
    not_before = CASE WHEN c.n > 0 THEN 'infinity'::timestamptz ELSE t.run_at END,
    updated_at = now()
  FROM (
    SELECT d.task_id,
      count(*) FILTER (WHERE dep.state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED'))::int AS n
    FROM task_dependencies d LEFT JOIN tasks dep ON dep.id = d.depends_on
    WHERE d.task_id = ANY(ids)
    GROUP BY d.task_id
  ) c
  WHERE t.id = c.task_id AND t.state = 'PENDING';
  PERFORM meshwork_dependencies_fail(ARRAY(
    SELECT DISTINCT d.depends_on
    FROM task_dependencies d JOIN tasks dep ON dep.id = d.depends_on
    WHERE d.task_id = ANY(ids) AND dep.state IN ('FAILED', 'CANCELED')));
END;
$$;
