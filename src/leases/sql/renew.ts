import { sql } from "drizzle-orm";
import { leaseHeld, leaseHeldBy } from "../../core/lease-check.js";
import { expiresIn } from "../../core/task-sql.js";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";

/**
 * Renewals: the lease's expiry moved to now() + its lease_seconds (or the
 * extension asked for), on the database clock, with the progress reported.
 * Nothing is read first: the UPDATE's WHERE is the lease check.
 */

const p = sql.placeholder;

/** RenewLease: one lease; the task as renewed (RenewLeaseResponse.task). */
export function renewStatement(db: Db) {
  return db
    .update(tasks)
    .set({
      leaseExpiresAt: expiresIn(sql`coalesce(${p("extend")}::int, ${tasks.leaseSeconds})`),
      progressSteps: sql`coalesce(${p("steps")}::int, ${tasks.progressSteps})`,
      progressMessage: sql`coalesce(${p("message")}::text, ${tasks.progressMessage})`,
      updatedAt: sql`now()`,
    })
    .where(leaseHeld)
    .returning()
    .prepare("meshwork_renew");
}

/** One StreamLeases message: every lease of one worker renewed in one statement. */
export function renewManyStatement(db: Db) {
  return db
    .update(tasks)
    .set({
      leaseExpiresAt: expiresIn(tasks.leaseSeconds),
      progressSteps: sql`coalesce(v.steps, ${tasks.progressSteps})`,
      progressMessage: sql`coalesce(v.message, ${tasks.progressMessage})`,
      updatedAt: sql`now()`,
    })
    .from(
      sql`jsonb_to_recordset(${p("items")}::jsonb) as v(id uuid, attempt int, token text, steps int, message text)`,
    )
    .where(
      leaseHeldBy({
        id: sql`v.id`,
        attempt: sql`v.attempt`,
        worker: sql`${p("worker")}::uuid`,
        token: sql`v.token`,
      }),
    )
    .returning({ id: tasks.id, attempt: tasks.attempt, expiresAt: tasks.leaseExpiresAt })
    .prepare("meshwork_renew_many");
}
