import { createHash, randomUUID } from "node:crypto";
import { and, asc, count, desc, eq, gte, inArray, lt, or, type SQL, sql } from "drizzle-orm";
import { canonicalJson } from "../core/canonical-json.js";
import { DomainError, notFound } from "../core/errors.js";
import { byTimeAndId, keysetAfter, type Position, pageOf } from "../core/paging.js";
import { stateIs } from "../core/task-sql.js";
import type { Db } from "../db/database.js";
import { lazy } from "../db/lazy.js";
import {
  type ArtifactRefJson,
  artifacts,
  type PreferenceJson,
  type RequirementJson,
  type Resources,
  type TaskEventRow,
  type TaskRow,
  type TaskStateName,
  taskEvents,
  tasks,
} from "../db/schema/index.js";
import { createTaskCounts } from "./counts.js";

/** A validated, defaulted task to create. */
export interface NewTask {
  /** The id to give the task (default: a new UUID); a caller that sets it can tell a new task from an idempotent repeat. */
  id?: string;
  name: string;
  workload: string;
  requiredCapabilities: string[];
  affinity: Record<string, string>;
  priority: number;
  deadline: Date | null;
  parameters: Record<string, unknown> | null;
  steps: number | null;
  maxAttempts: number;
  leaseSeconds: number;
  backoff: { initialMs: number; maxMs: number; multiplier: number };
  idempotencyKey: string | null;
  correlationId: string;
  /** The create request's W3C trace context (tracing/context.ts): `traceparent`, `tracestate`. */
  traceParent: string;
  traceState: string;
  /** The input artifact, resolved and checked by the caller. */
  input: ArtifactRefJson | null;
  /** What one attempt holds on its worker (always has `slots`). */
  resources: Resources;
  requirements: RequirementJson[];
  preferences: PreferenceJson[];
  share: string;
  /** Whether the request named the share (else it is the default, not part of the request). */
  shareGiven: boolean;
  concurrencyKey: string;
  rateKey: string;
}

/**
 * The scheduling fields that count in a request's hash: only those set to
 * something other than their default, so that a request that sets none
 * hashes as it did before they existed (an idempotent retry across an
 * upgrade is still a repeat).
 */
function schedulingOfRequest(t: NewTask): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const resources = Object.entries(t.resources);
  if (resources.length !== 1 || t.resources.slots !== 1) out.resources = t.resources;
  if (t.requirements.length > 0) out.requirements = t.requirements;
  if (t.preferences.length > 0) out.preferences = t.preferences;
  if (t.shareGiven) out.share = t.share;
  if (t.concurrencyKey !== "") out.concurrencyKey = t.concurrencyKey;
  if (t.rateKey !== "") out.rateKey = t.rateKey;
  return out;
}

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
  notBefore: null,
  startedAt: null,
  finishedAt: null,
  result: null,
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

/**
 * What identifies a create request for idempotency: everything but the
 * correlation id and trace context (tracing metadata that differs between
 * retries).
 */
export function requestHash(t: NewTask): string {
  // The input counts by its bytes: inline input_data stored twice is two
  // artifacts with the same content, and the same request.
  // The id is the caller's choice for a new task, not part of the request.
  const {
    correlationId: _,
    traceParent: _p,
    traceState: _s,
    id: _id,
    input,
    resources: _r,
    requirements: _q,
    preferences: _f,
    share: _h,
    shareGiven: _g,
    concurrencyKey: _c,
    rateKey: _k,
    ...rest
  } = t;
  const bytes = input ? { sha256: input.sha256, sizeBytes: input.sizeBytes } : null;
  const scheduling = schedulingOfRequest(t);
  return createHash("sha256")
    .update(
      canonicalJson({
        ...rest,
        input: bytes,
        ...(Object.keys(scheduling).length > 0 && { scheduling }),
      }),
    )
    .digest("hex");
}

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
     * order. A task whose idempotency key exists returns the existing task
     * when the request is the same, else the whole call is `already_exists`.
     */
    async create(input: NewTask[]): Promise<TaskRow[]> {
      const values = input.map((t) => ({
        id: t.id ?? randomUUID(),
        name: t.name,
        workload: t.workload,
        requiredCapabilities: t.requiredCapabilities,
        affinity: t.affinity,
        priority: t.priority,
        deadline: t.deadline,
        parameters: t.parameters,
        steps: t.steps,
        state: "PENDING" as const,
        maxAttempts: t.maxAttempts,
        leaseSeconds: t.leaseSeconds,
        backoffInitialMs: t.backoff.initialMs,
        backoffMaxMs: t.backoff.maxMs,
        backoffMultiplier: t.backoff.multiplier,
        idempotencyKey: t.idempotencyKey,
        requestHash: t.idempotencyKey === null ? null : requestHash(t),
        correlationId: t.correlationId,
        traceParent: t.traceParent,
        traceState: t.traceState,
        input: t.input,
        resources: t.resources,
        requirements: t.requirements,
        preferences: t.preferences,
        share: t.share,
        concurrencyKey: t.concurrencyKey,
        rateKey: t.rateKey,
      }));
      const unkeyed = values.every((v) => v.idempotencyKey === null);
      const inputIds = [...new Set(values.flatMap((v) => (v.input ? [v.input.artifactId] : [])))];
      if (unkeyed && inputIds.length === 0) {
        const rows = await db.insert(tasks).values(values).returning();
        return inOrder(values, rows);
      }
      return db.transaction(async (tx) => {
        // The inputs named are locked until the tasks naming them commit:
        // retention never deletes an input a create is naming (retention.ts).
        if (inputIds.length > 0) {
          const held = await tx
            .select({ id: artifacts.id })
            .from(artifacts)
            .where(inArray(artifacts.id, inputIds))
            .for("key share");
          const missing = inputIds.find((id) => !held.some((h) => h.id === id));
          if (missing) throw notFound(`input artifact ${missing}`);
        }
        if (unkeyed) {
          const rows = await tx.insert(tasks).values(values).returning();
          return inOrder(values, rows);
        }
        const inserted = await tx
          .insert(tasks)
          .values(values)
          .onConflictDoNothing({
            target: tasks.idempotencyKey,
            where: sql`${tasks.idempotencyKey} is not null`,
          })
          .returning();
        const byId = new Map(inserted.map((r) => [r.id, r]));
        const missingKeys = values
          .filter((v) => !byId.has(v.id) && v.idempotencyKey !== null)
          .map((v) => v.idempotencyKey as string);
        const existing =
          missingKeys.length === 0
            ? []
            : await tx.select().from(tasks).where(inArray(tasks.idempotencyKey, missingKeys));
        const byKey = new Map(existing.map((r) => [r.idempotencyKey, r]));
        for (const r of inserted) if (r.idempotencyKey) byKey.set(r.idempotencyKey, r);
        return values.map((v) => {
          const row =
            byId.get(v.id) ?? (v.idempotencyKey ? byKey.get(v.idempotencyKey) : undefined);
          if (!row) throw new Error("task neither inserted nor found");
          if (row.id !== v.id && row.requestHash !== v.requestHash) {
            throw new DomainError(
              "already_exists",
              "IDEMPOTENCY_KEY_REUSED",
              `idempotency_key ${JSON.stringify(v.idempotencyKey)} was used for a different request (task ${row.id})`,
              { taskId: row.id },
            );
          }
          return row;
        });
      });
    },

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
     * a page per transaction. Returns the tasks rerun.
     */
    async rerun(filter: BulkFilter, limit = bulkLimit): Promise<TaskRow[]> {
      return inPages(limit, (size) =>
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
          return rows.map((r) => ({ ...r, errorCode: "", errorMessage: "" }));
        }),
      );
    },

    /** Cancels live tasks as `cancel` does, oldest first, at most `limit`; returns their ids. */
    async cancelMatching(filter: BulkFilter, reason: string, limit = bulkLimit): Promise<string[]> {
      const rows = await inPages(limit, (size) =>
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
async function inPages<T>(limit: number, page: (size: number) => Promise<T[]>): Promise<T[]> {
  const all: T[] = [];
  while (all.length < limit) {
    const size = Math.min(bulkPage, limit - all.length);
    const rows = await page(size);
    all.push(...rows);
    if (rows.length < size) break;
  }
  return all;
}

function inOrder(values: { id: string }[], rows: TaskRow[]): TaskRow[] {
  const byId = new Map(rows.map((r) => [r.id, r]));
  return values.map((v) => {
    const row = byId.get(v.id);
    if (!row) throw new Error("inserted task missing from RETURNING");
    return row;
  });
}
