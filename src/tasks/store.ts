import { and, asc, count, desc, eq, gte, inArray, lt, or, type SQL, sql } from "drizzle-orm";
import { DomainError, notFound } from "../core/errors.js";
import { byTimeAndId, keysetAfter, type Position, pageOf } from "../core/paging.js";
import { stateIs } from "../core/task-sql.js";
import type { Db } from "../db/database.js";
import { lazy } from "../db/lazy.js";
import {
  type DeliveryRow,
  deliveries,
  type TaskEventRow,
  type TaskRow,
  type TaskStateName,
  taskEvents,
  tasks,
} from "../db/schema/index.js";
import { rowsOf } from "../db/values.js";
import { createTaskCounts } from "./counts.js";
import { createTasks, type NewTask } from "./create.js";

export type { NewTask } from "./create.js";

import { dependencyOutputs } from "./outputs.js";

export interface TaskFilter {
  state?: TaskStateName | undefined;
  workload?: string | undefined;
  correlationId?: string | undefined;
  workerId?: string | undefined;
}

/** The tasks a bulk operation (RerunTasks, CancelTasks) acts on, checked by the caller. */
export interface BulkFilter {
  /** The states it may act on (never empty). */
  states: TaskStateName[];
  workload?: string | undefined;
  taskIds?: string[] | undefined;
  /** Created at or after it. */
  createdAfter?: Date | undefined;
  /** Created before it. */
  createdBefore?: Date | undefined;
}

/** Tasks a bulk operation changes in one statement (and one transaction). */
const bulkPage = 500;
/** Tasks a bulk operation changes in one call, at most: a caller calls again for the rest. */
export const bulkLimit = 10_000;

function bulkWhere(f: BulkFilter): SQL | undefined {
  return and(
    stateIs(...f.states),
    f.workload === undefined ? undefined : eq(tasks.workload, f.workload),
    f.taskIds === undefined ? undefined : inArray(tasks.id, f.taskIds),
    f.createdAfter === undefined ? undefined : gte(tasks.createdAt, f.createdAfter),
    f.createdBefore === undefined ? undefined : lt(tasks.createdAt, f.createdBefore),
  );
}

/**
 * A rerun: PENDING again with the same id, parameters and input; a fresh
 * attempt budget (releases = attempt: no attempt so far counts against
 * max_attempts) with the attempt number going on, so that an earlier
 * attempt's worker stays fenced; no lease, placement, error, result,
 * progress or checkpoint. The error set here is the history's `RERUN`
 * event, cleared from the task by the next statement (the history records
 * a change's error, not a later clean-up: migration 0013).
 */
const rerunSet = {
  state: "PENDING" as const,
  releases: sql`${tasks.attempt}`,
  leaseWorkerId: null,
  leaseToken: null,
  leaseExpiresAt: null,
  assignedWorkerId: null,
  assignedApiBaseUrl: "",
  scheduleIdempotencyKey: null,
  errorCode: "RERUN",
  errorMessage: "rerun by a client",
  cancelRequested: false,
  // Never before its run_at, as at its creation (dependencies: tasks/sql/dependencies.sql).
  notBefore: sql`${tasks.runAt}`,
  startedAt: null,
  finishedAt: null,
  result: null,
  resultValue: null,
  resultSummary: "",
  metrics: {},
  completionHash: null,
  progressSteps: 0,
  progressMessage: "",
  checkpointHandle: "",
  updatedAt: sql`now()`,
};

/** A cancel (CancelTask, CancelTasks): CANCELED with the reason, its lease revoked at once. */
const canceledSet = (reason: string) => ({
  state: "CANCELED" as const,
  cancelRequested: true,
  errorCode: "CANCELED",
  errorMessage: reason,
  finishedAt: sql`now()`,
  updatedAt: sql`now()`,
});

/** Task reads and client-side writes. Lease transitions live in src/leases/. */
export function createTaskStore(db: Db) {
  const byId = lazy(() =>
    db
      .select()
      .from(tasks)
      .where(sql`${tasks.id} = ${sql.placeholder("id")}::uuid`)
      .prepare("meshwork_task_by_id"),
  );
  return {
    ...createTaskCounts(db),
    /**
     * Creates tasks in one transaction, all or none, returned in input
     * order (tasks/create.ts).
     */
    create: (input: NewTask[]): Promise<TaskRow[]> => createTasks(db, input),

    /** The dependency_outputs of tasks, by task id (tasks/outputs.ts). */
    dependencyOutputs: (rows: readonly Pick<TaskRow, "id" | "dependsOn">[]) =>
      dependencyOutputs(db, rows),

    async get(id: string): Promise<TaskRow> {
      const [row] = await byId().execute({ id });
      if (!row) throw notFound(`task ${id}`, { taskId: id });
      return row;
    },

    /** One page, newest first, and the token of the next page ("" at the end). */
    async list(
      filter: TaskFilter,
      size: number,
      after: Position | undefined,
    ): Promise<{ rows: TaskRow[]; next: string }> {
      const where = and(
        filter.state ? eq(tasks.state, filter.state) : undefined,
        filter.workload ? eq(tasks.workload, filter.workload) : undefined,
        filter.correlationId ? eq(tasks.correlationId, filter.correlationId) : undefined,
        filter.workerId
          ? or(
              eq(tasks.leaseWorkerId, filter.workerId),
              eq(tasks.assignedWorkerId, filter.workerId),
            )
          : undefined,
        keysetAfter([tasks.createdAt, tasks.id], after, "desc"),
      );
      const rows = await db
        .select()
        .from(tasks)
        .where(where)
        .orderBy(desc(tasks.createdAt), desc(tasks.id))
        .limit(size + 1);
      return pageOf(rows, size, (r) => byTimeAndId(r.createdAt, r.id));
    },

    /**
     * PENDING/ASSIGNED/RUNNING → CANCELED, revoking any lease at once: the
     * holder's next renewal or completion is `aborted`/TASK_CANCELED.
     */
    async cancel(id: string, reason: string): Promise<TaskRow> {
      const [row] = await db
        .update(tasks)
        .set(canceledSet(reason))
        .where(and(eq(tasks.id, id), stateIs("PENDING", "ASSIGNED", "RUNNING")))
        .returning();
      if (row) return row;
      const current = await this.get(id);
      throw new DomainError(
        "failed_precondition",
        "INVALID_STATE",
        `task ${id} is ${current.state} and cannot be cancelled`,
        { taskId: id },
      );
    },

    /**
     * Reruns FAILED/CANCELED tasks (rerunSet), oldest first, at most `limit`,
     * a page per transaction. Returns the tasks rerun. When the filter
     * matches tasks with dependencies, all go in one transaction: a task
     * recounted while a dependency of a later page is still FAILED would
     * fail again at once (and be selected again by the next page).
     */
    async rerun(filter: BulkFilter, limit = bulkLimit, page = bulkPage): Promise<TaskRow[]> {
      const [graph] = await db
        .select({ id: tasks.id })
        .from(tasks)
        .where(and(bulkWhere(filter), sql`${tasks.dependsOn} <> '{}'::uuid[]`))
        .limit(1);
      return inPages(limit, graph ? limit : page, (size) =>
        db.transaction(async (tx) => {
          const rows = await tx
            .update(tasks)
            .set(rerunSet)
            .where(inArray(tasks.id, oldestFirst(tx, filter, size)))
            .returning();
          if (rows.length === 0) return rows;
          const ids = rows.map((r) => r.id);
          await tx
            .update(tasks)
            .set({ errorCode: "", errorMessage: "" })
            .where(inArray(tasks.id, ids));
          if (!rows.some((r) => r.dependsOn.length > 0)) {
            return rows.map((r) => ({ ...r, errorCode: "", errorMessage: "" }));
          }
          // Tasks with dependencies wait for them again (tasks/sql/dependencies.sql).
          await tx.execute(
            sql`select meshwork_dependencies_reset(${`{${ids.join(",")}}`}::uuid[])`,
          );
          return tx
            .select()
            .from(tasks)
            .where(inArray(tasks.id, ids))
            .orderBy(tasks.createdAt, tasks.id);
        }),
      );
    },

    /**
     * The tasks that FAILED because `id` did (DEPENDENCY_FAILED), down the
     * graph: what RerunTask's rerun_dependents puts back with it, at most
     * `limit` (bulkLimit).
     */
    async failedDependents(id: string, limit = bulkLimit): Promise<string[]> {
      const rows = await rowsOf<{ id: string }>(
        db,
        sql`with recursive down(id) as (
            select d.task_id from task_dependencies d join tasks t on t.id = d.task_id
            where d.depends_on = ${id}::uuid and t.state = 'FAILED' and t.error_code = 'DEPENDENCY_FAILED'
            union
            select d.task_id from down join task_dependencies d on d.depends_on = down.id
              join tasks t on t.id = d.task_id
            where t.state = 'FAILED' and t.error_code = 'DEPENDENCY_FAILED'
          ) select id from down limit ${limit}`,
      );
      return rows.map((r) => String(r.id));
    },

    /** Cancels live tasks as `cancel` does, oldest first, at most `limit`; returns their ids. */
    async cancelMatching(filter: BulkFilter, reason: string, limit = bulkLimit): Promise<string[]> {
      const rows = await inPages(limit, bulkPage, (size) =>
        db.transaction((tx) =>
          tx
            .update(tasks)
            .set(canceledSet(reason))
            .where(inArray(tasks.id, oldestFirst(tx, filter, size)))
            .returning({ id: tasks.id }),
        ),
      );
      return rows.map((r) => r.id);
    },

    /** How many tasks a bulk filter matches now. */
    async countMatching(filter: BulkFilter): Promise<number> {
      const [row] = await db.select({ n: count() }).from(tasks).where(bulkWhere(filter));
      return row?.n ?? 0;
    },

    /**
     * One page of a task's history, oldest first, after the event of
     * sequence `after` (none: from the start). A task that does not exist
     * is not_found (one that exists has at least its creation event, unless
     * it was created before the history was kept).
     */
    async events(
      taskId: string,
      size: number,
      after: number | undefined,
    ): Promise<{ rows: TaskEventRow[]; next: string }> {
      const rows = await db
        .select()
        .from(taskEvents)
        .where(
          and(
            eq(taskEvents.taskId, taskId),
            after === undefined ? undefined : sql`${taskEvents.id} > ${after}`,
          ),
        )
        .orderBy(taskEvents.id)
        .limit(size + 1);
      if (rows.length === 0 && after === undefined) await this.get(taskId);
      return pageOf(rows, size, (r) => ({ at: r.at, keys: [String(r.id)] }));
    },

    /** The deliveries of the tasks with dispatch among `rows` (fleet/dispatch.ts), by task id. */
    async deliveries(rows: readonly TaskRow[]): Promise<Map<string, DeliveryRow>> {
      const ids = rows.filter((r) => r.dispatch).map((r) => r.id);
      if (ids.length === 0) return new Map();
      const found = await db.select().from(deliveries).where(inArray(deliveries.taskId, ids));
      return new Map(found.map((d) => [d.taskId, d]));
    },
  };
}

export type TaskStore = ReturnType<typeof createTaskStore>;

/** The ids of the oldest `size` tasks a filter matches, locked for the update that names them. */
function oldestFirst(tx: Pick<Db, "select">, filter: BulkFilter, size: number) {
  return tx
    .select({ id: tasks.id })
    .from(tasks)
    .where(bulkWhere(filter))
    .orderBy(asc(tasks.createdAt), asc(tasks.id))
    .limit(size)
    .for("update");
}

/** Runs `page` for pages of at most bulkPage rows until it returns fewer or `limit` is reached. */
async function inPages<T>(
  limit: number,
  pageSize: number,
  page: (size: number) => Promise<T[]>,
): Promise<T[]> {
  const all: T[] = [];
  while (all.length < limit) {
    const size = Math.min(pageSize, limit - all.length);
    const rows = await page(size);
    all.push(...rows);
    if (rows.length < size) break;
  }
  return all;
}
