import { and, sql } from "drizzle-orm";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";
import { pickedBy } from "./picked.js";

const p = sql.placeholder;

/** Expired leases (live-lease.sql, the one definition), oldest expiry first by tasks_lease_expiry_idx. */
const expiredLease = sql`meshwork_lease_expired(${tasks})`;

/**
 * Expired leases back to PENDING, or FAILED when attempts are used up.
 * The UPDATE re-checks the expiry on the locked row, so a completion
 * that committed first is never overwritten.
 *
 * `from` (null: from the first): only leases that expired at or after it.
 * The walk of tasks_lease_expiry_idx then starts there, past the entries
 * of every lease that ended before, which no vacuum can remove while a
 * transaction is held open (leases/store.ts, expireLeases).
 */
export function expireStatement(db: Db) {
  const due = db
    .select({ id: tasks.id })
    .from(tasks)
    .where(
      and(
        expiredLease,
        sql`${tasks.leaseExpiresAt} >= coalesce(${p("from")}::timestamptz, '-infinity')`,
      ),
    )
    .orderBy(tasks.leaseExpiresAt)
    .limit(p("limit"))
    .for("update", { skipLocked: true });
  const exhausted = sql`${tasks.failures} >= ${tasks.maxAttempts}`;
  return db
    .update(tasks)
    .set({
      state: sql`case when ${exhausted} then 'FAILED' else 'PENDING' end`,
      errorCode: "LEASE_EXPIRED",
      errorMessage: sql`meshwork_expiry_message(${tasks.attempt})`,
      finishedAt: sql`case when ${exhausted} then now() end`,
      assignedWorkerId: null,
      assignedApiBaseUrl: "",
      updatedAt: sql`now()`,
    })
    .where(and(pickedBy(due), expiredLease))
    .returning({ id: tasks.id, state: tasks.state })
    .prepare("meshwork_expire_leases");
}
