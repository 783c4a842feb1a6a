CREATE TABLE "tokens" (
	"id" uuid PRIMARY KEY NOT NULL,
	"name" text NOT NULL,
	"role" text NOT NULL,
	"digest" text NOT NULL,
	"created_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	"last_used_at" timestamp (3) with time zone,
	"revoked_at" timestamp (3) with time zone
);
--> statement-breakpoint
ALTER TABLE "workers" ADD COLUMN "owner_token_id" uuid;--> statement-breakpoint
CREATE UNIQUE INDEX "tokens_name_idx" ON "tokens" USING btree ("name");--> statement-breakpoint
CREATE UNIQUE INDEX "tokens_digest_idx" ON "tokens" USING btree ("digest");--> statement-breakpoint
CREATE INDEX "tokens_created_idx" ON "tokens" USING btree ("created_at" DESC NULLS LAST,"id" DESC NULLS LAST);