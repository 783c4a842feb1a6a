import { and, asc, eq, inArray, isNull, lte, or, sql } from "drizzle-orm";
import type { Db } from "../db/database.js";
import { type DeliveryRow, deliveries, tasks, workers } from "../db/schema/index.js";
import { asBoolean, asNumber } from "../db/values.js";
import type { DispatchResult, DispatchTarget } from "./dispatch-send.js";

/** A delivery claimed for sending: its row, what the request carries, and the lease's length. */
export interface ClaimedDelivery extends DispatchTarget {
  workerId: string;
  /** Requests sent before this one. */
  tries: number;
  /** The placement's lease length, in seconds (a re-placement gets the same). */
  leaseSeconds: number;
}

/**
 * The deliveries of pushed attempts (the `deliveries` table): claims of due
 * rows, one replica each, and the outcome of each request with its history
 * event.
 */
export function createDispatchStore(db: Db) {
  return {
    /**
     * Claims up to `max` due deliveries (FOR UPDATE SKIP LOCKED: a row
     * another replica is claiming is skipped), holding each for `holdMs`
     * (claimed_until: longer than one request), so that no other replica
     * sends it meanwhile. A row whose task is no longer ASSIGNED on its
     * attempt and worker under a live lease is not sent: it is closed
     * (FAILED, or ACCEPTED when that worker already started it).
     */
    async claim(max: number, holdMs: number): Promise<ClaimedDelivery[]> {
      if (max <= 0) return [];
      return db.transaction(async (tx) => {
        const rows = await tx
          .select({
            d: deliveries,
            state: tasks.state,
            attempt: tasks.attempt,
            assigned: tasks.assignedWorkerId,
            leaseWorker: tasks.leaseWorkerId,
            leaseToken: tasks.leaseToken,
            leaseExpiresAt: tasks.leaseExpiresAt,
            live: sql`${tasks.leaseExpiresAt} > now()`.mapWith(asBoolean),
            leaseSeconds:
              sql`extract(epoch from ${tasks.leaseExpiresAt} - ${tasks.updatedAt})`.mapWith(
                asNumber,
              ),
            workload: tasks.workload,
            parameters: tasks.parameters,
            input: tasks.input,
            correlationId: tasks.correlationId,
            traceparent: tasks.traceParent,
            apiBaseUrl: workers.apiBaseUrl,
            dispatchPath: workers.dispatchPath,
            secret: workers.dispatchSecret,
            registeredFrom: workers.registeredFrom,
          })
          .from(deliveries)
          .innerJoin(tasks, eq(tasks.id, deliveries.taskId))
          .leftJoin(workers, eq(workers.id, deliveries.workerId))
          .where(
            and(
              eq(deliveries.state, "DELIVERING"),
              lte(deliveries.nextAt, sql`now()`),
              or(isNull(deliveries.claimedUntil), lte(deliveries.claimedUntil, sql`now()`)),
            ),
          )
          .orderBy(asc(deliveries.nextAt))
          .limit(max)
          .for("update", { of: deliveries, skipLocked: true });
        const mine = (r: (typeof rows)[number]) =>
          r.attempt === r.d.attempt &&
          (r.assigned === r.d.workerId || r.leaseWorker === r.d.workerId);
        const fresh = rows.filter(
          (r) => r.state === "ASSIGNED" && mine(r) && r.live && r.apiBaseUrl !== null,
        );
        const started = rows.filter((r) => r.state === "RUNNING" && mine(r));
        const stale = rows.filter((r) => !fresh.includes(r) && !started.includes(r));
        const close = async (list: typeof rows, state: "ACCEPTED" | "FAILED", why: string) => {
          if (list.length === 0) return;
          await tx
            .update(deliveries)
            .set({ state, claimedUntil: null, lastError: why })
            .where(
              inArray(
                deliveries.taskId,
                list.map((r) => r.d.taskId),
              ),
            );
        };
        await close(started, "ACCEPTED", "");
        await close(stale, "FAILED", "not sent: the attempt is no longer assigned to the worker");
        if (fresh.length > 0) {
          await tx
            .update(deliveries)
            .set({ claimedUntil: sql`now() + ${holdMs} * interval '1 millisecond'` })
            .where(
              inArray(
                deliveries.taskId,
                fresh.map((r) => r.d.taskId),
              ),
            );
        }
        return fresh.map((r) => ({
          taskId: r.d.taskId,
          attempt: r.d.attempt,
          workerId: r.d.workerId,
          tries: r.d.tries,
          leaseToken: r.leaseToken ?? "",
          leaseExpiresAt: r.leaseExpiresAt ?? new Date(),
          leaseSeconds: Math.round(r.leaseSeconds),
          workload: r.workload,
          parameters: r.parameters ?? null,
          input: r.input,
          correlationId: r.correlationId,
          traceparent: r.traceparent,
          apiBaseUrl: r.apiBaseUrl ?? "",
          dispatchPath: r.dispatchPath ?? "/meshwork/tasks",
          secret: r.secret ?? null,
          registeredFrom: r.registeredFrom ?? "",
        }));
      });
    },

    /**
     * Records one request's outcome and its history event (kind
     * `dispatch`) in one transaction. `retryInMs` (a request that may be
     * sent again) keeps the delivery DELIVERING, due then, while the lease
     * lasts past then; else it ends `final`. Answers the delivery as it
     * now is, or undefined when the row moved on (another attempt).
     */
    async record(
      d: Pick<ClaimedDelivery, "taskId" | "attempt" | "workerId">,
      result: DispatchResult,
      final: "ACCEPTED" | "FAILED",
      retryInMs: number | null,
    ): Promise<DeliveryRow | undefined> {
      return db.transaction(async (tx) => {
        await tx.execute(sql`insert into task_events (task_id, state, attempt, worker_id, kind, detail)
          select ${d.taskId}::uuid, 'ASSIGNED', ${d.attempt}, ${d.workerId}::uuid, 'dispatch', ${JSON.stringify(result)}::jsonb
          where exists (select 1 from tasks where id = ${d.taskId}::uuid for key share)`);
        const again =
          retryInMs === null
            ? sql`false`
            : sql`now() + ${retryInMs} * interval '1 millisecond' < (select t.lease_expires_at from tasks t where t.id = ${deliveries.taskId})`;
        const [row] = await tx
          .update(deliveries)
          .set({
            state: sql`case when ${again} then 'DELIVERING' else ${final} end`,
            tries: sql`${deliveries.tries} + 1`,
            nextAt:
              retryInMs === null
                ? sql`${deliveries.nextAt}`
                : sql`now() + ${retryInMs} * interval '1 millisecond'`,
            claimedUntil: null,
            lastStatus: result.httpStatus,
            lastError: result.error.slice(0, 1000),
            lastAt: sql`now()`,
          })
          .where(
            and(
              eq(deliveries.taskId, d.taskId),
              eq(deliveries.attempt, d.attempt),
              eq(deliveries.workerId, d.workerId),
              eq(deliveries.state, "DELIVERING"),
            ),
          )
          .returning();
        return row;
      });
    },

    /**
     * An attempt that could be delivered nowhere, given back: PENDING again
     * (a claim or a new placement may take it), its assignment cleared, and
     * released (releases + 1) so that it does not count against
     * max_attempts; error DISPATCH_FAILED. Only while the task is still
     * ASSIGNED on this attempt and worker. Answers whether it did.
     */
    async giveBack(
      d: Pick<ClaimedDelivery, "taskId" | "attempt" | "workerId">,
      why: string,
    ): Promise<boolean> {
      const rows = await db
        .update(tasks)
        .set({
          state: "PENDING",
          releases: sql`${tasks.releases} + 1`,
          assignedWorkerId: null,
          assignedApiBaseUrl: "",
          errorCode: "DISPATCH_FAILED",
          errorMessage: why.slice(0, 2000),
          updatedAt: sql`now()`,
        })
        .where(
          and(
            eq(tasks.id, d.taskId),
            eq(tasks.state, "ASSIGNED"),
            eq(tasks.attempt, d.attempt),
            eq(tasks.assignedWorkerId, d.workerId),
          ),
        )
        .returning({ id: tasks.id });
      return rows.length > 0;
    },
  };
}

export type DispatchStore = ReturnType<typeof createDispatchStore>;
