CREATE TABLE "artifacts" (
	"id" uuid PRIMARY KEY NOT NULL,
	"task_id" uuid,
	"attempt" integer DEFAULT 0 NOT NULL,
	"worker_id" uuid,
	"filename" text NOT NULL,
	"content_type" text DEFAULT '' NOT NULL,
	"kind" text NOT NULL,
	"sha256" text NOT NULL,
	"size_bytes" bigint NOT NULL,
	"created_at" timestamp (3) with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE INDEX "artifacts_task_idx" ON "artifacts" USING btree ("task_id","created_at","id");