-- The claim order breaks ties of created_at (kept to the millisecond: every
-- task of one CreateTasks call, and tasks created in the same millisecond,
-- share it) by id, which is time-ordered: tasks are claimed in the order
-- they were made, as ListTasks lists them. Rebuilding the two indexes scans
-- the whole tasks table, and the migration's transaction holds it locked
-- (ACCESS EXCLUSIVE: every read and write of tasks waits) until it ends.
DROP INDEX "tasks_ready_idx";--> statement-breakpoint
DROP INDEX "tasks_share_claim_idx";--> statement-breakpoint
CREATE INDEX "tasks_ready_idx" ON "tasks" USING btree ("priority" DESC NULLS LAST,"deadline","created_at","id") WHERE "tasks"."state" = 'PENDING' and "tasks"."dependencies_pending" = 0;--> statement-breakpoint
CREATE INDEX "tasks_share_claim_idx" ON "tasks" USING btree ("share","priority" DESC NULLS LAST,"deadline","created_at","id") WHERE "tasks"."state" = 'PENDING' and "tasks"."dependencies_pending" = 0;