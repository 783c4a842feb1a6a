-- Two claims on two replicas could each reserve the same task for their own
-- worker (src/leases/sql/claim.sql); keep the earliest reservation of each
-- task before the index makes a second one impossible.
UPDATE "workers" w SET "reserved_task_id" = NULL, "reserved_at" = NULL
  WHERE w."reserved_task_id" IS NOT NULL AND EXISTS (
    SELECT 1 FROM "workers" o
    WHERE o."reserved_task_id" = w."reserved_task_id"
      AND (o."reserved_at", o."id") < (w."reserved_at", w."id"));
--> statement-breakpoint
CREATE UNIQUE INDEX "workers_reserved_task_idx" ON "workers" USING btree ("reserved_task_id") WHERE "workers"."reserved_task_id" is not null;
