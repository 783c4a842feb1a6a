CREATE TABLE "coordinator_meta" (
	"key" text PRIMARY KEY NOT NULL,
	"value" text NOT NULL
);
--> statement-breakpoint
CREATE TABLE "knowledge_entries" (
	"kind" text NOT NULL,
	"key" text NOT NULL,
	"value" jsonb NOT NULL,
	"version" bigint NOT NULL,
	"updated_at" timestamp (3) with time zone NOT NULL,
	"origin" text NOT NULL,
	CONSTRAINT "knowledge_entries_kind_key_pk" PRIMARY KEY("kind","key")
);
--> statement-breakpoint
CREATE INDEX "knowledge_updated_idx" ON "knowledge_entries" USING btree ("updated_at","kind","key");