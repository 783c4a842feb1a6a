import { and, sql } from "drizzle-orm";
import { stateIs } from "../../core/task-sql.js";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";
import { pickedBy } from "./picked.js";

const p = sql.placeholder;

/** PENDING tasks whose deadline passed → FAILED (DEADLINE_EXCEEDED). */
export function failPastDeadlineStatement(db: Db) {
  const overdue = and(stateIs("PENDING"), sql`${tasks.deadline} <= now()`);
  const due = db
    .select({ id: tasks.id })
    .from(tasks)
    .where(overdue)
    .limit(p("limit"))
    .for("update", { skipLocked: true });
  return db
    .update(tasks)
    .set({
      state: "FAILED",
      errorCode: "DEADLINE_EXCEEDED",
      errorMessage: "the deadline passed before the task could run",
      finishedAt: sql`now()`,
      updatedAt: sql`now()`,
    })
    .where(and(pickedBy(due), overdue))
    .returning({ id: tasks.id })
    .prepare("meshwork_fail_past_deadline");
}
