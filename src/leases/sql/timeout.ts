import { and, sql } from "drizzle-orm";
import { stateIs } from "../../core/task-sql.js";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";
import { backoffMs } from "./fail.js";
import { pickedBy } from "./picked.js";

const p = sql.placeholder;

/**
 * Live attempts past their attempt_deadline (the grant's time plus the
 * task's timeout_seconds, grant.sql), oldest first by
 * tasks_attempt_deadline_idx: failed with TIMEOUT, as a FailTask that is
 * retryable would (PENDING after the backoff while attempts remain, else
 * FAILED). The lease ends with it: the holder's next renewal, over
 * StreamLeases, is CANCELED with reason TIMEOUT (live-lease.sql's verdict).
 */
export function timeoutStatement(db: Db) {
  const overdue = and(
    stateIs("ASSIGNED", "RUNNING"),
    sql`${tasks.attemptDeadline} is not null and ${tasks.attemptDeadline} <= now()`,
  );
  const due = db
    .select({ id: tasks.id })
    .from(tasks)
    .where(overdue)
    .orderBy(tasks.attemptDeadline)
    .limit(p("limit"))
    .for("update", { skipLocked: true });
  const retry = sql`${tasks.failures} < ${tasks.maxAttempts}`;
  return db
    .update(tasks)
    .set({
      state: sql`case when ${retry} then 'PENDING' else 'FAILED' end`,
      notBefore: sql`case when ${retry} then now() + ${backoffMs} * interval '1 millisecond' end`,
      finishedAt: sql`case when ${retry} then null else now() end`,
      errorCode: "TIMEOUT",
      errorMessage: sql`'attempt ' || ${tasks.attempt}::text || ' ran past the timeout of ' || ${tasks.timeoutSeconds}::text || ' s'`,
      assignedWorkerId: null,
      assignedApiBaseUrl: "",
      updatedAt: sql`now()`,
    })
    .where(and(pickedBy(due), overdue))
    .returning({ id: tasks.id, state: tasks.state })
    .prepare("meshwork_timeout_attempts");
}
