CREATE INDEX "artifacts_sha256_idx" ON "artifacts" USING btree ("sha256");--> statement-breakpoint
CREATE INDEX "tasks_retry_idx" ON "tasks" USING btree ("not_before") WHERE "tasks"."state" = 'PENDING' and "tasks"."not_before" is not null;--> statement-breakpoint
CREATE INDEX "tasks_finished_idx" ON "tasks" USING btree ("finished_at") WHERE "tasks"."state" in ('SUCCEEDED', 'FAILED', 'CANCELED');--> statement-breakpoint
CREATE INDEX "tasks_input_artifact_idx" ON "tasks" USING btree (("input"->>'artifactId')) WHERE "tasks"."input" is not null;--> statement-breakpoint

-- Every lease transition updates a tasks row, and state and lease_expires_at
-- are indexed, so few of those updates are HOT: the table gathers dead
-- tuples fast. Vacuum and analyze it after 2% of its rows changed rather
-- than the default 20% / 10% (README: Autovacuum). Only per-table storage
-- parameters: a server with autovacuum off stays off.
ALTER TABLE "tasks" SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
