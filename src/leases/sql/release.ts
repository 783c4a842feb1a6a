import { and, eq, getTableColumns, sql } from "drizzle-orm";
import { leaseHeld } from "../../core/lease-check.js";
import { stateIs } from "../../core/task-sql.js";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";

const p = sql.placeholder;
const columns = getTableColumns(tasks);

/** A lease given back without counting a failure (ReleaseTask, DeregisterWorker). */
export const released = {
  state: "PENDING",
  releases: sql`${tasks.releases} + 1`,
  notBefore: null,
  assignedWorkerId: null,
  assignedApiBaseUrl: "",
  updatedAt: sql`now()`,
} as const;

/** ReleaseTask: the holder gives the task back, keeping its checkpoint. */
export function releaseStatement(db: Db) {
  return db
    .update(tasks)
    .set({ ...released, checkpointHandle: sql`${p("checkpoint")}::text` })
    .where(leaseHeld)
    .returning(columns)
    .prepare("meshwork_release");
}

/**
 * Deregistration: every task leased to the worker back to PENDING, live
 * or expired (an expired one would otherwise wait for the sweeper). Not
 * prepared: it runs once per worker's life.
 */
export function releaseWorker(db: Db, workerId: string) {
  return db
    .update(tasks)
    .set(released)
    .where(and(eq(tasks.leaseWorkerId, workerId), stateIs("ASSIGNED", "RUNNING")))
    .returning({ id: tasks.id });
}
