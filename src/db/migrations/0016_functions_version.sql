-- Which text of the database functions is installed (src/db/functions.ts): a
-- replica applies its functions only when its version is at least this one.
CREATE TABLE "meshwork_functions" (
	"key" text PRIMARY KEY NOT NULL,
	"version" integer NOT NULL,
	"hash" text NOT NULL,
	"applied_at" timestamp (3) with time zone DEFAULT now() NOT NULL
);
