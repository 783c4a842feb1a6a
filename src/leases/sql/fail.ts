import { getTableColumns, sql } from "drizzle-orm";
import { leaseHeld } from "../../core/lease-check.js";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";

const p = sql.placeholder;
const columns = getTableColumns(tasks);

/** Backoff before retry n (n = failures so far): initial × multiplier^(n−1), capped at max. */
export const backoffMs = sql`least(${tasks.backoffMaxMs},
  ${tasks.backoffInitialMs} * power(${tasks.backoffMultiplier}, greatest(${tasks.failures} - 1, 0)))`;

/** PENDING after a backoff while retryable with attempts left, else FAILED. */
export function failStatement(db: Db) {
  const retry = sql`(${p("retryable")}::boolean and ${tasks.failures} < ${tasks.maxAttempts})`;
  return db
    .update(tasks)
    .set({
      state: sql`case when ${retry} then 'PENDING' else 'FAILED' end`,
      notBefore: sql`case when ${retry} then now() + ${backoffMs} * interval '1 millisecond' end`,
      finishedAt: sql`case when ${retry} then null else now() end`,
      errorCode: sql`${p("code")}::text`,
      errorMessage: sql`${p("message")}::text`,
      assignedWorkerId: null,
      assignedApiBaseUrl: "",
      updatedAt: sql`now()`,
    })
    .where(leaseHeld)
    .returning(columns)
    .prepare("meshwork_fail");
}
