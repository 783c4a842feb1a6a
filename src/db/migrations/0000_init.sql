CREATE TABLE "tasks" (
	"id" uuid PRIMARY KEY NOT NULL,
	"name" text DEFAULT '' NOT NULL,
	"workload" text NOT NULL,
	"required_capabilities" text[] DEFAULT '{}'::text[] NOT NULL,
	"affinity" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"priority" integer DEFAULT 0 NOT NULL,
	"deadline" timestamp (3) with time zone,
	"parameters" jsonb,
	"input" jsonb,
	"steps" integer,
	"state" text NOT NULL,
	"attempt" integer DEFAULT 0 NOT NULL,
	"releases" integer DEFAULT 0 NOT NULL,
	"max_attempts" integer NOT NULL,
	"lease_seconds" integer NOT NULL,
	"backoff_initial_ms" integer NOT NULL,
	"backoff_max_ms" integer NOT NULL,
	"backoff_multiplier" double precision NOT NULL,
	"idempotency_key" text,
	"request_hash" text,
	"correlation_id" text DEFAULT '' NOT NULL,
	"assigned_worker_id" uuid,
	"assigned_api_base_url" text DEFAULT '' NOT NULL,
	"schedule_idempotency_key" text,
	"lease_worker_id" uuid,
	"lease_token" text,
	"lease_expires_at" timestamp (3) with time zone,
	"checkpoint_handle" text DEFAULT '' NOT NULL,
	"progress_steps" integer DEFAULT 0 NOT NULL,
	"progress_message" text DEFAULT '' NOT NULL,
	"result" jsonb,
	"result_summary" text DEFAULT '' NOT NULL,
	"metrics" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"completion_hash" text,
	"error_code" text DEFAULT '' NOT NULL,
	"error_message" text DEFAULT '' NOT NULL,
	"cancel_requested" boolean DEFAULT false NOT NULL,
	"not_before" timestamp (3) with time zone,
	"created_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	"started_at" timestamp (3) with time zone,
	"finished_at" timestamp (3) with time zone
);
--> statement-breakpoint
CREATE TABLE "workers" (
	"id" uuid PRIMARY KEY NOT NULL,
	"name" text DEFAULT '' NOT NULL,
	"capabilities" text[] DEFAULT '{}'::text[] NOT NULL,
	"labels" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"cpu_count" integer DEFAULT 0 NOT NULL,
	"memory_mb" bigint DEFAULT 0 NOT NULL,
	"api_base_url" text DEFAULT '' NOT NULL,
	"max_concurrency" integer DEFAULT 1 NOT NULL,
	"drained" boolean DEFAULT false NOT NULL,
	"queue_depth" integer DEFAULT 0 NOT NULL,
	"registered_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	"last_heartbeat_at" timestamp (3) with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX "tasks_idempotency_key_idx" ON "tasks" USING btree ("idempotency_key") WHERE "tasks"."idempotency_key" is not null;--> statement-breakpoint
CREATE INDEX "tasks_claim_idx" ON "tasks" USING btree ("priority" DESC NULLS LAST,"deadline","created_at") WHERE "tasks"."state" = 'PENDING';--> statement-breakpoint
CREATE INDEX "tasks_lease_expiry_idx" ON "tasks" USING btree ("lease_expires_at") WHERE "tasks"."state" in ('ASSIGNED', 'RUNNING');--> statement-breakpoint
CREATE INDEX "tasks_lease_worker_idx" ON "tasks" USING btree ("lease_worker_id") WHERE "tasks"."state" in ('ASSIGNED', 'RUNNING');--> statement-breakpoint
CREATE INDEX "tasks_deadline_idx" ON "tasks" USING btree ("deadline") WHERE "tasks"."state" = 'PENDING' and "tasks"."deadline" is not null;--> statement-breakpoint
CREATE INDEX "tasks_created_idx" ON "tasks" USING btree ("created_at" DESC NULLS LAST,"id" DESC NULLS LAST);--> statement-breakpoint
CREATE INDEX "tasks_correlation_idx" ON "tasks" USING btree ("correlation_id");--> statement-breakpoint
CREATE INDEX "tasks_workload_state_idx" ON "tasks" USING btree ("workload","state");--> statement-breakpoint
CREATE INDEX "workers_registered_idx" ON "workers" USING btree ("registered_at","id");