CREATE TABLE "corrupt_blobs" (
	"sha256" text PRIMARY KEY NOT NULL,
	"found_at" timestamp (3) with time zone DEFAULT now() NOT NULL
);
