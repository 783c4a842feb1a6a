CREATE TABLE "concurrency_limits" (
	"key" text PRIMARY KEY NOT NULL,
	"max_running" integer NOT NULL
);
--> statement-breakpoint
CREATE TABLE "rate_limits" (
	"key" text PRIMARY KEY NOT NULL,
	"per_second" double precision NOT NULL,
	"burst" integer NOT NULL,
	"tokens" double precision NOT NULL,
	"refilled_at" timestamp (3) with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "share_usage" (
	"path" text PRIMARY KEY NOT NULL,
	"usage" double precision NOT NULL,
	"updated_at" timestamp (3) with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "shares" (
	"path" text PRIMARY KEY NOT NULL,
	"weight" double precision NOT NULL
);
--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "resources" jsonb DEFAULT '{"slots":1}'::jsonb NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "requirements" jsonb DEFAULT '[]'::jsonb NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "preferences" jsonb DEFAULT '[]'::jsonb NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "share" text DEFAULT 'default' NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "concurrency_key" text DEFAULT '' NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "rate_key" text DEFAULT '' NOT NULL;--> statement-breakpoint
ALTER TABLE "workers" ADD COLUMN "capacity" jsonb DEFAULT '{}'::jsonb NOT NULL;--> statement-breakpoint
ALTER TABLE "workers" ADD COLUMN "reserved_task_id" uuid;--> statement-breakpoint
ALTER TABLE "workers" ADD COLUMN "reserved_at" timestamp (3) with time zone;--> statement-breakpoint
CREATE INDEX "tasks_share_claim_idx" ON "tasks" USING btree ("share","priority" DESC NULLS LAST,"deadline","created_at") WHERE "tasks"."state" = 'PENDING';--> statement-breakpoint
CREATE INDEX "tasks_rate_idx" ON "tasks" USING btree ("rate_key","workload") WHERE "tasks"."state" = 'PENDING' and "tasks"."rate_key" <> '';--> statement-breakpoint
CREATE INDEX "tasks_concurrency_idx" ON "tasks" USING btree ("concurrency_key") WHERE "tasks"."state" in ('ASSIGNED', 'RUNNING') and "tasks"."concurrency_key" <> '';--> statement-breakpoint
-- Workers registered before capacity existed offer what they reported:
-- cpu_count × 1000 millicores and memory_mb.
UPDATE "workers" SET "capacity" = jsonb_strip_nulls(jsonb_build_object(
  'cpu', CASE WHEN "cpu_count" > 0 THEN "cpu_count"::bigint * 1000 END,
  'memory', CASE WHEN "memory_mb" > 0 THEN "memory_mb" END));
--> statement-breakpoint
-- The claim now takes a plan and a reservation bound (src/leases/sql/claim.sql,
-- applied after the migrations): beside the five-argument one it replaces,
-- every call would be ambiguous.
DROP FUNCTION IF EXISTS meshwork_claim(uuid, text[], jsonb, int, int);
