-- Long polls are woken by how many tasks became claimable, per workload, not
-- all at once: NOTIFY meshwork_task_ready now carries a JSON object of
-- workload → count ({"render":500}), and each replica wakes about that many
-- of its parked claims that can take them (src/leases/wakeup.ts). A burst of
-- 500 new tasks used to wake every parked poll (2,000 claims for 500 tasks).
--
-- The counts are made by the statement-level triggers that already write the
-- task history (0013), from the same transition tables: no trigger runs per
-- row. A task that goes back to PENDING counts once its not_before has
-- passed; until then the sweeper wakes claims for it when it falls due. A
-- payload too long for NOTIFY (over ~7,900 bytes, counted in bytes: very many
-- or very long workload names at once) is
-- sent empty, which wakes every parked claim, as before.
DROP TRIGGER tasks_ready_on_insert ON tasks;
--> statement-breakpoint
DROP TRIGGER tasks_ready_on_update ON tasks;
--> statement-breakpoint
DROP FUNCTION meshwork_notify_task_ready();
--> statement-breakpoint
CREATE FUNCTION meshwork_notify_ready(ready text) RETURNS void
LANGUAGE sql AS $$
  SELECT pg_notify('meshwork_task_ready', CASE WHEN octet_length(ready) <= 7900 THEN ready ELSE '' END)
  WHERE ready IS NOT NULL
$$;
--> statement-breakpoint
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
  RETURN NULL;
END;
$$;
--> statement-breakpoint
CREATE OR REPLACE FUNCTION meshwork_task_events_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  ready text;
BEGIN
  -- One pass over the changed rows: their history, then the ready counts.
  WITH changed AS (
    SELECT n.id, n.state, n.attempt, n.workload, n.not_before, o.state AS old_state,
      coalesce(n.lease_worker_id, n.assigned_worker_id) AS worker_id,
      CASE WHEN n.state IN ('PENDING', 'FAILED', 'CANCELED') THEN n.error_code ELSE '' END AS error_code,
      CASE WHEN n.state IN ('PENDING', 'FAILED', 'CANCELED') THEN n.error_message ELSE '' END AS error_message
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.state IS DISTINCT FROM n.state
      OR o.attempt IS DISTINCT FROM n.attempt
      OR o.lease_worker_id IS DISTINCT FROM n.lease_worker_id
  ), recorded AS (
    INSERT INTO task_events (task_id, state, attempt, worker_id, error_code, error_message)
    SELECT id, state, attempt, worker_id, error_code, error_message FROM changed
  )
  SELECT json_object_agg(c.workload, c.n)::text INTO ready
  FROM (
    SELECT workload, count(*) AS n FROM changed
    WHERE state = 'PENDING' AND old_state IS DISTINCT FROM 'PENDING'
      AND (not_before IS NULL OR not_before <= now())
    GROUP BY workload
  ) c;
  PERFORM meshwork_notify_ready(ready);
  RETURN NULL;
END;
$$;
