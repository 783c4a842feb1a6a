ALTER TABLE "task_events" DROP CONSTRAINT "task_events_task_id_tasks_id_fk";
--> statement-breakpoint
-- A task's events go with it: one DELETE per statement that deletes tasks,
-- in place of the foreign key's cascade (the function's text is kept in
-- src/tasks/sql/history.sql, applied after the migrations). A replica older
-- than this migration records a delivery's event without locking its task
-- first: during a rolling upgrade, a retention delete that commits between
-- its check and its insert can leave that one event behind.
CREATE OR REPLACE FUNCTION meshwork_task_events_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM task_events WHERE task_id = ANY (ARRAY(SELECT id FROM old_rows));
  RETURN NULL;
END;
$$;--> statement-breakpoint
CREATE TRIGGER tasks_events_on_delete
AFTER DELETE ON tasks
REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION meshwork_task_events_deleted();
