CREATE TABLE "deliveries" (
	"task_id" uuid PRIMARY KEY NOT NULL,
	"attempt" integer NOT NULL,
	"worker_id" uuid NOT NULL,
	"state" text NOT NULL,
	"tries" integer DEFAULT 0 NOT NULL,
	"next_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	"claimed_until" timestamp (3) with time zone,
	"last_status" integer DEFAULT 0 NOT NULL,
	"last_error" text DEFAULT '' NOT NULL,
	"last_at" timestamp (3) with time zone
);
--> statement-breakpoint
ALTER TABLE "task_events" ADD COLUMN "kind" text DEFAULT 'state' NOT NULL;--> statement-breakpoint
ALTER TABLE "task_events" ADD COLUMN "detail" jsonb;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "dispatch" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "workers" ADD COLUMN "dispatch_path" text DEFAULT '/meshwork/tasks' NOT NULL;--> statement-breakpoint
ALTER TABLE "workers" ADD COLUMN "dispatch_secret" text;--> statement-breakpoint
ALTER TABLE "workers" ADD COLUMN "registered_from" text DEFAULT '' NOT NULL;--> statement-breakpoint
ALTER TABLE "deliveries" ADD CONSTRAINT "deliveries_task_id_tasks_id_fk" FOREIGN KEY ("task_id") REFERENCES "public"."tasks"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "deliveries_due_idx" ON "deliveries" USING btree ("next_at") WHERE "deliveries"."state" = 'DELIVERING';