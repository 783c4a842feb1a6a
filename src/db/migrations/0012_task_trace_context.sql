ALTER TABLE "tasks" ADD COLUMN "trace_parent" text DEFAULT '' NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "trace_state" text DEFAULT '' NOT NULL;
-- The W3C trace context of the request that created the task (empty for
-- tasks created before). meshwork_claim and meshwork_claim_batch (0008,
-- 0011) return the `tasks` row type, which these columns join: claims
-- return them from the same statement, and the functions stay as they are.
