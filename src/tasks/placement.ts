import { eq, getTableColumns, sql } from "drizzle-orm";
import { DomainError, notFound } from "../core/errors.js";
import { describeRequirement, describeShortfall } from "../core/scheduling.js";
import { asResources, liveLeases, pushGranted } from "../core/task-sql.js";
import { workerLost } from "../core/worker-sql.js";
import type { Db } from "../db/database.js";
import {
  type Resources,
  type TaskRow,
  tasks,
  type WorkerRow,
  workers,
} from "../db/schema/index.js";
import { asBoolean, asNumber, rowsOf } from "../db/values.js";

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
  /**
   * A re-placement after a failed delivery (fleet/dispatch.ts): only while
   * the task is still ASSIGNED on this attempt and worker, and never on
   * that worker again.
   */
  redeliver?: { attempt: number; workerId: string };
}

interface Candidate extends WorkerRow {
  activeLeases: number;
  lost: boolean;
  /** The database's verdict: the worker fits the task (meshwork_fits, the claim's rule). */
  fits: boolean;
  /** The indexes of the task's requirements its labels do not meet (meshwork_requirement_holds). */
  unmetRequirements: number[];
  /** What it has free for the task (meshwork_free: capacity less live leases and a reservation). */
  free: Resources;
  /** What it offers in all (meshwork_capacity). */
  total: Resources;
  /** Its score for the task's preferences (meshwork_preference_score). */
  score: number;
}

/** The capabilities a worker offers for placement: advertised ones, plus `<id>` for every label value `brick:<id>` (as meshwork_offered). */
export function offered(w: Pick<WorkerRow, "capabilities" | "labels">): Set<string> {
  const set = new Set(w.capabilities);
  for (const v of Object.values(w.labels)) if (v.startsWith("brick:")) set.add(v.slice(6));
  return set;
}

/**
 * Which of the task's workload, capabilities and affinity the worker
 * misses, in words, for the NO_CANDIDATE message only: whether it fits is
 * the database's verdict (`fits`, by meshwork_fits in
 * src/leases/sql/match.sql, the rule the claim uses; requirements are
 * named from the database's own list). test/contract/placement-match.test.ts
 * checks that the two agree.
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
    const words = [
      ...unmet(w, task),
      ...w.unmetRequirements.flatMap((i) => {
        const r = task.requirements[i];
        return r ? [`requirement ${describeRequirement(r)} not met`] : [];
      }),
    ];
    why.push(...(words.length > 0 ? words : ["does not match the task"]));
  }
  why.push(...describeShortfall(task.resources, w.free, w.total, w.maxConcurrency));
  return why;
}

/**
 * Push placement (ScheduleTask, RetryTask). The task row is locked for the
 * whole decision, so concurrent calls on one task place it once; the chosen
 * worker's row is locked too, and what it has free counted again under the
 * lock, so that no placement or claim over-commits it; the task's
 * concurrency and rate limits are taken in the same transaction
 * (meshwork_limits_take), and the lease is granted by the claim's own
 * grant (meshwork_grant).
 */
/**
 * A task is placed no earlier than a claim could take it: not while it
 * waits for its dependencies, nor before its run_at (database clock); and
 * RetryTask does not run a task its dependencies failed.
 */
async function assertDue(tx: Pick<Db, "execute">, task: TaskRow): Promise<void> {
  const refuse = (why: string) =>
    new DomainError("failed_precondition", "INVALID_STATE", `task ${task.id} ${why}`, {
      taskId: task.id,
      currentAttempt: task.attempt,
      task,
    });
  if (task.dependenciesPending > 0) {
    throw refuse(`waits for ${task.dependenciesPending} of its dependencies to finish`);
  }
  if (task.errorCode === "DEPENDENCY_FAILED") {
    throw refuse(
      "failed because a dependency did: rerun that dependency with rerun_dependents (RerunTask), not a placement",
    );
  }
  if (task.state !== "PENDING" || task.runAt === null || task.attempt > 0) return;
  const [row] = await rowsOf<{ due: unknown }>(
    tx,
    sql`select ${task.runAt.toISOString()}::timestamptz <= now() as due`,
  );
  if (!asBoolean(row?.due)) throw refuse(`is not due before ${task.runAt.toISOString()} (run_at)`);
}

export function createPlacementStore(db: Db, heartbeatIntervalSeconds: number) {
  async function place(p: PlacementRequest, retry: boolean): Promise<TaskRow> {
    return db.transaction(async (tx) => {
      const [task] = await tx.select().from(tasks).where(eq(tasks.id, p.taskId)).for("update");
      if (!task) throw notFound(`task ${p.taskId}`, { taskId: p.taskId });
      const details = { taskId: task.id, currentAttempt: task.attempt, task };
      const again = p.redeliver;
      if (
        again &&
        (task.state !== "ASSIGNED" ||
          task.attempt !== again.attempt ||
          task.assignedWorkerId !== again.workerId)
      ) {
        throw new DomainError(
          "aborted",
          "STALE_ATTEMPT",
          `task ${task.id} is no longer ASSIGNED on attempt ${again.attempt}`,
          details,
        );
      }
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
      await assertDue(tx, task);
      // What a worker has free for this task: its own lease (a re-placement)
      // does not count against it.
      const free = sql`meshwork_free(${workers}, ${task.id}::uuid)`;
      const rows = await tx
        .select({
          worker: workers,
          activeLeases: liveLeases(workers.id, task.id).mapWith(asNumber),
          lost: workerLost(heartbeatIntervalSeconds),
          fits: workerFits,
          unmetRequirements: sql<
            number[]
          >`array(select r.i - 1 from jsonb_array_elements(${tasks.requirements}) with ordinality as r(v, i)
            where not meshwork_requirement_holds(r.v, ${workers.labels}))`.mapWith((v) =>
            (Array.isArray(v) ? v : []).map(Number),
          ),
          free: free.mapWith(asResources),
          total: sql`meshwork_capacity(${workers})`.mapWith(asResources),
          score:
            sql<number>`meshwork_preference_score(${tasks.preferences}, ${workers.labels})`.mapWith(
              asNumber,
            ),
        })
        .from(workers)
        .innerJoin(tasks, eq(tasks.id, task.id));
      const all: Candidate[] = rows.map(({ worker, ...r }) => ({ ...worker, ...r }));
      // Most free slots (a worker without a limit has the most), then lowest
      // queue depth, then latest heartbeat; the preferences' score first.
      const slotsFree = (w: Candidate) => w.free.slots ?? 0;
      const fits = all
        .filter((w) => rejections(w, task).length === 0 && w.id !== again?.workerId)
        .sort(
          (a, b) =>
            b.score - a.score ||
            slotsFree(b) - slotsFree(a) ||
            a.queueDepth - b.queueDepth ||
            b.lastHeartbeatAt.getTime() - a.lastHeartbeatAt.getTime(),
        );
      // A retry moves the task off its previous worker when another fits.
      const previous = task.assignedWorkerId ?? task.leaseWorkerId;
      if (retry) fits.sort((a, b) => Number(a.id === previous) - Number(b.id === previous));
      let chosen: Candidate | undefined;
      for (const w of fits) {
        // Lock the worker (claims take the same lock), then count what it
        // has free again, in a new statement (a new snapshot): a placement
        // or claim that committed while this waited for the lock is seen,
        // so none over-commits it.
        await tx
          .select({ id: workers.id })
          .from(workers)
          .where(eq(workers.id, w.id))
          .for("no key update");
        const [again] = await rowsOf<{ fits: boolean | string }>(
          tx,
          sql`select meshwork_fits_in(t.resources, meshwork_free(w, t.id)) as fits
            from workers w, tasks t
            where w.id = ${w.id}::uuid and t.id = ${task.id}::uuid`,
        );
        if (asBoolean(again?.fits)) {
          chosen = w;
          break;
        }
        w.free = {};
      }
      if (chosen && (task.concurrencyKey !== "" || task.rateKey !== "")) {
        await takeLimits(tx, task);
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
      // An attempt its worker never received is given back, not failed: a
      // refused or undeliverable dispatch does not count against max_attempts.
      if (again) {
        await tx
          .update(tasks)
          .set({ releases: sql`${tasks.releases} + 1` })
          .where(eq(tasks.id, task.id));
      }
      // The grant's plan settings (src/leases/sql/grant.sql), for this transaction.
      await tx.execute(sql`set local enable_seqscan = off`);
      const [placed] = await tx.select(getTableColumns(tasks)).from(
        pushGranted(task.id, chosen.id, {
          leaseSeconds: p.leaseSeconds,
          scheduleKey: p.key === "" ? null : p.key,
          correlationId: p.correlationId,
        }),
      );
      if (!placed) throw new Error("placement update returned nothing");
      if (placed.dispatch) await deliverNow(tx, placed);
      return placed;
    });
  }
  return {
    schedule: (p: PlacementRequest) => place(p, false),
    retry: (p: PlacementRequest) => place(p, true),
  };
}

/**
 * Takes the task's concurrency and rate limits for the placement
 * (meshwork_limits_take, waiting for a claim that holds the key; its rate
 * token is taken), or refuses it with `resource_exhausted`: retry later.
 */
async function takeLimits(tx: Db, task: TaskRow): Promise<void> {
  const [row] = await rowsOf<{ why: string | null }>(
    tx,
    sql`select meshwork_limits_take(${task.id}::uuid, ${task.concurrencyKey}, ${task.rateKey}, true) as why`,
  );
  const details = { taskId: task.id };
  if (row?.why === "CONCURRENCY_LIMIT") {
    throw new DomainError(
      "resource_exhausted",
      "CONCURRENCY_LIMIT",
      `task ${task.id} cannot be placed now: as many tasks with concurrency_key ${task.concurrencyKey} hold leases as its limit allows`,
      details,
    );
  }
  if (row?.why === "RATE_LIMIT") {
    throw new DomainError(
      "resource_exhausted",
      "KEY_RATE_LIMIT",
      `task ${task.id} cannot be placed now: rate_key ${task.rateKey} has no token left`,
      details,
    );
  }
}

/**
 * The delivery of a placed attempt with dispatch, due now, in the
 * placement's transaction: the dispatchers of every replica (fleet/dispatch.ts)
 * see it when it commits; the row of an earlier attempt is replaced, so a
 * stale attempt is never sent.
 */
async function deliverNow(tx: Db, task: TaskRow): Promise<void> {
  await tx.execute(sql`insert into deliveries (task_id, attempt, worker_id, state)
    values (${task.id}::uuid, ${task.attempt}, ${task.assignedWorkerId}::uuid, 'DELIVERING')
    on conflict (task_id) do update set attempt = excluded.attempt, worker_id = excluded.worker_id,
      state = 'DELIVERING', tries = 0, next_at = now(), claimed_until = null,
      last_status = 0, last_error = '', last_at = null`);
}

export type PlacementStore = ReturnType<typeof createPlacementStore>;
