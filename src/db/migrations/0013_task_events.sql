CREATE TABLE "task_events" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "task_events_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"task_id" uuid NOT NULL,
	"at" timestamp (3) with time zone DEFAULT clock_timestamp() NOT NULL,
	"state" text NOT NULL,
	"attempt" integer NOT NULL,
	"worker_id" uuid,
	"error_code" text DEFAULT '' NOT NULL,
	"error_message" text DEFAULT '' NOT NULL
);
--> statement-breakpoint
ALTER TABLE "task_events" ADD CONSTRAINT "task_events_task_id_tasks_id_fk" FOREIGN KEY ("task_id") REFERENCES "public"."tasks"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "task_events_task_idx" ON "task_events" USING btree ("task_id","id");--> statement-breakpoint
-- A task's history, written here so that every path that changes a task
-- (CreateTask, claims in meshwork_claim and meshwork_claim_batch, the
-- sweeper, cancel, retry, any replica) records it in the same transaction.
-- Statement-level triggers with transition tables: a CreateTasks of 1,000
-- or a claim of 32 writes its events with one INSERT … SELECT, not one
-- trigger call per row. An update records an event only when the state,
-- the attempt or the lease holder changed (not for renewals or progress).
-- An event carries the task's error only where the change is the error's
-- (back to PENDING for a retry or after an expiry, FAILED, CANCELED): a new
-- attempt does not repeat the last one's.
-- Tasks created before this migration have a history from their next change.
CREATE FUNCTION meshwork_task_events_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO task_events (task_id, state, attempt, worker_id, error_code, error_message)
  SELECT n.id, n.state, n.attempt, coalesce(n.lease_worker_id, n.assigned_worker_id),
    n.error_code, n.error_message
  FROM new_rows n;
  RETURN NULL;
END;
$$;
--> statement-breakpoint
CREATE FUNCTION meshwork_task_events_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO task_events (task_id, state, attempt, worker_id, error_code, error_message)
  SELECT n.id, n.state, n.attempt, coalesce(n.lease_worker_id, n.assigned_worker_id),
    CASE WHEN n.state IN ('PENDING', 'FAILED', 'CANCELED') THEN n.error_code ELSE '' END,
    CASE WHEN n.state IN ('PENDING', 'FAILED', 'CANCELED') THEN n.error_message ELSE '' END
  FROM new_rows n JOIN old_rows o ON o.id = n.id
  WHERE o.state IS DISTINCT FROM n.state
    OR o.attempt IS DISTINCT FROM n.attempt
    OR o.lease_worker_id IS DISTINCT FROM n.lease_worker_id;
  RETURN NULL;
END;
$$;
--> statement-breakpoint
CREATE TRIGGER tasks_events_on_insert AFTER INSERT ON tasks
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION meshwork_task_events_inserted();
--> statement-breakpoint
CREATE TRIGGER tasks_events_on_update AFTER UPDATE ON tasks
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION meshwork_task_events_updated();
