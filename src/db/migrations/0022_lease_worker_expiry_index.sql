CREATE INDEX "tasks_lease_worker_expiry_idx" ON "tasks" USING btree ("lease_worker_id","lease_expires_at") WHERE "tasks"."state" in ('ASSIGNED', 'RUNNING');--> statement-breakpoint
DROP INDEX "tasks_lease_worker_idx";
