import { eq, getTableColumns, sql } from "drizzle-orm";
import { DomainError, notFound } from "../core/errors.js";
import { liveLeases, pushGranted } from "../core/task-sql.js";
import { workerLost } from "../core/worker-sql.js";
import type { Db } from "../db/database.js";
import { type TaskRow, tasks, type WorkerRow, workers } from "../db/schema/index.js";
import { asBoolean, asNumber } from "../db/values.js";

/**
 * Whether the worker fits the task, by the claim's own matching function
 * (src/leases/sql/match.sql), offering what placement offers (its
 * capabilities and `brick:` labels, meshwork_offered).
 */
const workerFits =
  sql<boolean>`meshwork_fits(${tasks}, meshwork_offered(${workers.capabilities}, ${workers.labels}), ${workers.labels})`.mapWith(
    asBoolean,
  );

export interface PlacementRequest {
  taskId: string;
  /** Empty when not given. */
  key: string;
  /** Empty when not given. */
  correlationId: string;
  leaseSeconds: number;
}

interface Candidate extends WorkerRow {
  activeLeases: number;
  lost: boolean;
  /** The database's verdict: the worker fits the task (meshwork_fits, the claim's rule). */
  fits: boolean;
}

/** The capabilities a worker offers for placement: advertised ones, plus `<id>` for every label value `brick:<id>` (as meshwork_offered). */
export function offered(w: Pick<WorkerRow, "capabilities" | "labels">): Set<string> {
  const set = new Set(w.capabilities);
  for (const v of Object.values(w.labels)) if (v.startsWith("brick:")) set.add(v.slice(6));
  return set;
}

/**
 * Which of the task's requirements the worker misses, in words, for the
 * NO_CANDIDATE message only: whether it fits is the database's verdict
 * (`fits`, by meshwork_fits in src/leases/sql/match.sql, the rule the claim
 * uses). test/contract/placement-match.test.ts checks that the two agree.
 */
export function unmet(w: Pick<WorkerRow, "capabilities" | "labels">, task: TaskRow): string[] {
  const why: string[] = [];
  for (const [k, v] of Object.entries(task.affinity)) {
    if (w.labels[k] !== v) why.push(`label ${k} is not ${v}`);
  }
  const caps = offered(w);
  for (const c of [task.workload, ...task.requiredCapabilities]) {
    if (!caps.has(c)) why.push(`missing capability ${c}`);
  }
  return why;
}

/** Every reason a worker cannot take the task (docs/protocol.md#push-placement); empty when it can. */
export function rejections(w: Candidate, task: TaskRow): string[] {
  const why: string[] = [];
  if (w.drained) why.push("drained");
  if (w.lost) why.push("lost (no heartbeat for 3 intervals)");
  if (w.apiBaseUrl === "") why.push("no api_base_url");
  if (!w.fits) {
    const words = unmet(w, task);
    why.push(...(words.length > 0 ? words : ["does not match the task"]));
  }
  if (w.maxConcurrency !== 0 && w.activeLeases >= w.maxConcurrency) {
    why.push(`no free slot (${w.activeLeases}/${w.maxConcurrency})`);
  }
  return why;
}

/**
 * Push placement (ScheduleTask, RetryTask). The task row is locked for the
 * whole decision, so concurrent calls on one task place it once; the chosen
 * worker's row is locked too, so two tasks cannot both take its last slot.
 */
export function createPlacementStore(db: Db, heartbeatIntervalSeconds: number) {
  async function place(p: PlacementRequest, retry: boolean): Promise<TaskRow> {
    return db.transaction(async (tx) => {
      const [task] = await tx.select().from(tasks).where(eq(tasks.id, p.taskId)).for("update");
      if (!task) throw notFound(`task ${p.taskId}`, { taskId: p.taskId });
      const details = { taskId: task.id, currentAttempt: task.attempt, task };
      if (task.state === "ASSIGNED" || (retry && task.state === "RUNNING")) {
        if (p.key !== "" && p.key === task.scheduleIdempotencyKey) return task; // same assignment
        if (!retry) {
          throw new DomainError(
            "aborted",
            "ALREADY_ASSIGNED",
            `task ${task.id} is already assigned to worker ${task.assignedWorkerId} under another schedule_idempotency_key`,
            details,
          );
        }
      }
      const allowed = retry ? ["ASSIGNED", "RUNNING", "FAILED"] : ["PENDING"];
      if (!allowed.includes(task.state)) {
        throw new DomainError(
          "failed_precondition",
          "INVALID_STATE",
          `task ${task.id} is ${task.state}: ${retry ? "RetryTask takes ASSIGNED, RUNNING or FAILED" : "ScheduleTask takes PENDING"} tasks`,
          details,
        );
      }
      const rows = await tx
        .select({
          worker: workers,
          // The task being re-placed does not take a slot of its current holder.
          activeLeases: liveLeases(workers.id, task.id).mapWith(asNumber),
          lost: workerLost(heartbeatIntervalSeconds),
          fits: workerFits,
        })
        .from(workers)
        .innerJoin(tasks, eq(tasks.id, task.id));
      const all: Candidate[] = rows.map((r) => ({
        ...r.worker,
        activeLeases: r.activeLeases,
        lost: r.lost,
        fits: r.fits,
      }));
      // A worker without a limit (max_concurrency 0) has the most free slots.
      const free = (w: Candidate) =>
        w.maxConcurrency === 0 ? Number.POSITIVE_INFINITY : w.maxConcurrency - w.activeLeases;
      const fits = all
        .filter((w) => rejections(w, task).length === 0)
        .sort(
          (a, b) =>
            (free(a) === free(b) ? 0 : free(b) > free(a) ? 1 : -1) ||
            a.queueDepth - b.queueDepth ||
            b.lastHeartbeatAt.getTime() - a.lastHeartbeatAt.getTime(),
        );
      // A retry moves the task off its previous worker when another fits.
      const previous = task.assignedWorkerId ?? task.leaseWorkerId;
      if (retry) fits.sort((a, b) => Number(a.id === previous) - Number(b.id === previous));
      let chosen: Candidate | undefined;
      for (const w of fits) {
        // Lock the worker (claims take the same lock) and count its slots
        // again under the lock, in a new statement: a placement or claim
        // that committed meanwhile is seen, so none overfills it.
        await tx
          .select({ id: workers.id })
          .from(workers)
          .where(eq(workers.id, w.id))
          .for("no key update");
        const [now] = await tx
          .select({ live: liveLeases(workers.id, task.id).mapWith(asNumber) })
          .from(workers)
          .where(eq(workers.id, w.id));
        if (now && (w.maxConcurrency === 0 || now.live < w.maxConcurrency)) {
          chosen = w;
          break;
        }
        w.activeLeases = now?.live ?? w.maxConcurrency;
      }
      if (!chosen) {
        // The nearest workers first: those that fail the fewest rules.
        const reasons = all
          .map((w) => ({ w, why: rejections(w, task) }))
          .sort((a, b) => a.why.length - b.why.length)
          .slice(0, 8)
          .map(({ w, why }) => `${w.name || w.id}: ${why.join(", ")}`)
          .join("; ");
        throw new DomainError(
          "failed_precondition",
          "NO_CANDIDATE",
          `no worker can take task ${task.id}${reasons ? ` (${reasons})` : " (no workers registered)"}`,
          details,
        );
      }
      const [placed] = await tx.select(getTableColumns(tasks)).from(
        pushGranted(task.id, chosen.id, {
          leaseSeconds: p.leaseSeconds,
          scheduleKey: p.key === "" ? null : p.key,
          correlationId: p.correlationId,
        }),
      );
      if (!placed) throw new Error("placement update returned nothing");
      return placed;
    });
  }
  return {
    schedule: (p: PlacementRequest) => place(p, false),
    retry: (p: PlacementRequest) => place(p, true),
  };
}

export type PlacementStore = ReturnType<typeof createPlacementStore>;
