-- The grant of a lease, written once for its two callers: the claim
-- (claim.sql: pulled, RUNNING at once) and push placement
-- (tasks/placement.ts: ASSIGNED to the worker's api_base_url until its
-- StartTask). Each caller has locked the rows `ids` and decided that
-- `worker` takes them; this writes what a lease is: the next attempt, the
-- holder, a new token (meshwork_new_token) and an expiry lease_seconds from
-- now on the database clock.
--
-- `push` false (a claim): RUNNING, the assignment columns cleared, started
-- now (unless an earlier attempt started it), and a task taken over from an
-- expired lease says so in its error. `push` true (a placement): ASSIGNED
-- with the worker's api_base_url, `lease_secs` kept as the task's
-- lease_seconds (the placement may ask for its own), the schedule key and,
-- when not empty, the correlation id; finished_at cleared (RetryTask
-- re-places FAILED tasks).
--
-- plpgsql, so that its plan is cached per connection. Its callers run it
-- with sequential scans and JIT off (the claim's own settings, SET LOCAL in
-- placement's transaction), so that the UPDATE reaches its rows by primary
-- key whatever the table's size was when the plan was made (see claim.sql);
-- settings of its own would cost every claim a save and restore of them.
CREATE OR REPLACE FUNCTION meshwork_grant(
  ids uuid[], worker uuid, push boolean,
  lease_secs int DEFAULT NULL, schedule_key text DEFAULT NULL, correlation text DEFAULT NULL)
RETURNS SETOF tasks
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  url text := '';
BEGIN
  IF push THEN
    SELECT w.api_base_url INTO url FROM workers w WHERE w.id = worker;
  END IF;
  RETURN QUERY
    WITH granted AS (
      UPDATE tasks t SET
        state = CASE WHEN push THEN 'ASSIGNED' ELSE 'RUNNING' END,
        attempt = t.attempt + 1,
        lease_worker_id = worker,
        lease_token = meshwork_new_token(),
        lease_seconds = coalesce(lease_secs, t.lease_seconds),
        lease_expires_at = now() + make_interval(secs => coalesce(lease_secs, t.lease_seconds)),
        error_code = CASE WHEN NOT push AND t.state <> 'PENDING' THEN 'LEASE_EXPIRED' ELSE t.error_code END,
        error_message = CASE WHEN NOT push AND t.state <> 'PENDING'
          THEN meshwork_expiry_message(t.attempt) ELSE t.error_message END,
        assigned_worker_id = CASE WHEN push THEN worker END,
        assigned_api_base_url = url,
        schedule_idempotency_key = CASE WHEN push THEN schedule_key ELSE t.schedule_idempotency_key END,
        correlation_id = CASE WHEN push AND coalesce(correlation, '') <> ''
          THEN correlation ELSE t.correlation_id END,
        not_before = NULL,
        attempt_deadline = now() + make_interval(secs => t.timeout_seconds),
        cancel_requested = false,
        started_at = CASE WHEN push THEN t.started_at ELSE coalesce(t.started_at, now()) END,
        finished_at = NULL,
        updated_at = now()
      WHERE t.id = ANY (ids)
      RETURNING t.*
    )
    SELECT * FROM granted;
END;
$$;
