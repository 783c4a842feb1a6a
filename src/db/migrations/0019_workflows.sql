CREATE TABLE "schedules" (
	"id" uuid PRIMARY KEY NOT NULL,
	"name" text NOT NULL,
	"cron" text NOT NULL,
	"time_zone" text DEFAULT 'UTC' NOT NULL,
	"template" jsonb NOT NULL,
	"overlap_policy" text DEFAULT 'SKIP' NOT NULL,
	"catch_up_policy" text DEFAULT 'ONE' NOT NULL,
	"catch_up_limit" integer DEFAULT 10 NOT NULL,
	"paused" boolean DEFAULT false NOT NULL,
	"next_run_at" timestamp (3) with time zone,
	"last_run_at" timestamp (3) with time zone,
	"last_task_id" uuid,
	"request_hash" text NOT NULL,
	"created_by" text DEFAULT '' NOT NULL,
	"created_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "schedules_name_key" UNIQUE("name")
);
--> statement-breakpoint
CREATE TABLE "task_dependencies" (
	"task_id" uuid NOT NULL,
	"depends_on" uuid NOT NULL,
	CONSTRAINT "task_dependencies_task_id_depends_on_pk" PRIMARY KEY("task_id","depends_on")
);
--> statement-breakpoint
CREATE TABLE "task_log_tails" (
	"task_id" uuid PRIMARY KEY NOT NULL,
	"kept" integer DEFAULT 0 NOT NULL,
	"dropped" bigint DEFAULT 0 NOT NULL
);
--> statement-breakpoint
CREATE TABLE "task_logs" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "task_logs_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"task_id" uuid NOT NULL,
	"attempt" integer NOT NULL,
	"worker_id" uuid,
	"stream" text DEFAULT 'log' NOT NULL,
	"line" text NOT NULL,
	"at" timestamp (3) with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "run_at" timestamp (3) with time zone;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "ref" text DEFAULT '' NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "depends_on" uuid[] DEFAULT '{}'::uuid[] NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "dependency_policy" text DEFAULT 'ALL_SUCCEEDED' NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "dependencies_pending" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "timeout_seconds" integer;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "attempt_deadline" timestamp (3) with time zone;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "result_value" jsonb;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "schedule_id" uuid;--> statement-breakpoint
ALTER TABLE "task_dependencies" ADD CONSTRAINT "task_dependencies_task_id_tasks_id_fk" FOREIGN KEY ("task_id") REFERENCES "public"."tasks"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "task_log_tails" ADD CONSTRAINT "task_log_tails_task_id_tasks_id_fk" FOREIGN KEY ("task_id") REFERENCES "public"."tasks"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "task_logs" ADD CONSTRAINT "task_logs_task_id_tasks_id_fk" FOREIGN KEY ("task_id") REFERENCES "public"."tasks"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "schedules_due_idx" ON "schedules" USING btree ("next_run_at") WHERE not "schedules"."paused" and "schedules"."next_run_at" is not null;--> statement-breakpoint
CREATE INDEX "task_dependencies_depends_on_idx" ON "task_dependencies" USING btree ("depends_on");--> statement-breakpoint
CREATE INDEX "task_logs_task_idx" ON "task_logs" USING btree ("task_id","id");--> statement-breakpoint
CREATE INDEX "tasks_attempt_deadline_idx" ON "tasks" USING btree ("attempt_deadline") WHERE "tasks"."state" in ('ASSIGNED', 'RUNNING') and "tasks"."attempt_deadline" is not null;--> statement-breakpoint
CREATE INDEX "tasks_schedule_idx" ON "tasks" USING btree ("schedule_id") WHERE "tasks"."schedule_id" is not null and "tasks"."state" in ('PENDING', 'ASSIGNED', 'RUNNING');