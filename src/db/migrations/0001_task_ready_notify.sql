-- Wake long-polling claimers on every replica when a task becomes claimable.
-- NOTIFY is delivered at commit and identical notifications in one
-- transaction are folded into one.
CREATE FUNCTION meshwork_notify_task_ready() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('meshwork_task_ready', '');
  RETURN NULL;
END;
$$;
--> statement-breakpoint
-- Every insert creates PENDING tasks: one notification per statement, so a
-- 1,000-task CreateTasks wakes claimers once.
CREATE TRIGGER tasks_ready_on_insert AFTER INSERT ON tasks
FOR EACH STATEMENT
EXECUTE FUNCTION meshwork_notify_task_ready();
--> statement-breakpoint
-- Row-level with WHEN, so the common updates (claims, completions, renewals)
-- never call the function.
CREATE TRIGGER tasks_ready_on_update AFTER UPDATE OF state ON tasks
FOR EACH ROW WHEN (NEW.state = 'PENDING' AND OLD.state IS DISTINCT FROM 'PENDING')
EXECUTE FUNCTION meshwork_notify_task_ready();
