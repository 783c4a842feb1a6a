import { sql } from "drizzle-orm";
import { DomainError, notFound } from "../core/errors.js";
import { type Judged, judged, leaseParams, leaseRefusal } from "../core/lease-check.js";
import type { LeaseRef } from "../core/lease-ref.js";
import type { Db } from "../db/database.js";
import { answeredWithError, isDeadlock, isTransientDatabaseError } from "../db/faults.js";
import type { TaskRow } from "../db/schema/index.js";
import { asNumber, preparedRowsOf, rowsOf } from "../db/values.js";
import { createBatcher } from "./batcher.js";
import {
  type ClaimAnswer,
  type ClaimedRow,
  type ClaimingWorker,
  type ClaimScheduling,
  createClaimStatement,
  createSlotsStatement,
  type ExpirySweep,
  sweepMargin,
} from "./claim.js";
import { type Completion, completionHash, isEmpty } from "./completion.js";
import { rateRefillsByWorkload } from "./sql/retries.js";
import { createTransitions, releaseWorker } from "./transitions.js";

export type { ClaimAnswer, ClaimedRow, ClaimingWorker, ExpirySweep, Slots } from "./claim.js";
export { type Completion, completionHash } from "./completion.js";

export interface Progress {
  completedSteps: number;
  message: string;
}

/** The outcome of one item of a batch: its value, or why it was refused. */
export type Outcome<T = TaskRow> = { ok: T; repeat?: boolean } | { error: DomainError };

/**
 * Items in task id order: statements that update several tasks lock them in
 * the order they meet them, and two such statements (a worker's renewals,
 * a batch of completions) that met the same tasks in opposite orders
 * deadlocked. In one order, they queue instead.
 */
function byTaskId<T extends { taskId: string }>(items: readonly T[]): T[] {
  return [...items].sort((a, b) => (a.taskId < b.taskId ? -1 : a.taskId > b.taskId ? 1 : 0));
}

/** Runs `fn`, and once more when it fails with an error `again` accepts. */
async function retryOnce<T>(again: (error: unknown) => boolean, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    if (!again(error)) throw error;
    return fn();
  }
}

/**
 * Every lease transition: claims, renewals, completions, failures,
 * releases, expiry. The statements are prepared once per store (claim.ts,
 * transitions.ts); a refused request costs one more read, to name why.
 * `readyHintMs`: how long a claim batch's hint of the first ready task is
 * used (claim.ts, readyHintMs; tests set it).
 */
export function createLeaseStore(
  db: Db,
  scheduling?: ClaimScheduling,
  sweep?: ExpirySweep,
  readyHintMs?: number,
) {
  // Claims made while one is in flight go together in the next statement
  // (group commit, as completions do). When the database refuses that
  // statement (it answered with an error, so nothing was leased: a
  // deadlock, a timeout, one claim's data it could not take), each claim
  // goes again alone and gets its own answer: one claim never fails the
  // others. A failure with no answer (the connection lost) is not run
  // again: leases may have been granted, and would sit leased to nobody
  // while more were taken; for that, the callers retry.
  const claimStatement = createClaimStatement(db, scheduling, sweep, readyHintMs);
  const claim = createBatcher(
    async (items: { worker: ClaimingWorker; max: number }[]): Promise<(ClaimAnswer | Error)[]> => {
      try {
        return await claimStatement(items);
      } catch (error) {
        if (items.length === 1 || !answeredWithError(error)) throw error;
        return Promise.all(
          items.map((item) =>
            claimStatement([item]).then(
              ([answer]) => answer ?? new Error("the claim statement answered nothing"),
              (alone: unknown) => (alone instanceof Error ? alone : new Error(String(alone))),
            ),
          ),
        );
      }
    },
    { maxBatch: 64 },
  );
  async function claimCounted(worker: ClaimingWorker, max: number): Promise<ClaimAnswer> {
    const answer = await claim({ worker, max });
    if (answer instanceof Error) throw answer;
    return answer;
  }
  const slots = createSlotsStatement(db);
  const q = createTransitions(db);

  async function refuse(l: LeaseRef): Promise<never> {
    const [found] = await q.judged().execute(leaseParams(l));
    throw leaseRefusal(found && judged(found), l);
  }

  /**
   * The tasks of refused items, each with the database's verdict on it
   * (undefined: no such task), in the items' order: one read for a batch.
   */
  async function judge(items: readonly LeaseRef[]): Promise<(Judged | undefined)[]> {
    if (items.length === 0) return [];
    const rows = await q.judgedMany().execute({
      items: JSON.stringify(
        items.map((l, i) => ({
          i,
          id: l.taskId,
          attempt: l.attempt,
          worker: l.workerId,
          token: l.token,
        })),
      ),
    });
    const found: (Judged | undefined)[] = items.map(() => undefined);
    for (const { i, ...row } of rows) found[i] = judged(row);
    return found;
  }

  /**
   * `judge`, read once more after a transient fault. It runs after a
   * statement that may have committed (a completion, a renewal): were its
   * fault to fail the whole call, the call sent again would find its own
   * completions done, and answer them as repeats of an earlier call. The
   * read changes nothing, so it is safe to send again.
   */
  const judgeAgain = (items: readonly LeaseRef[]) =>
    retryOnce(isTransientDatabaseError, () => judge(items));

  /**
   * How many PENDING tasks, by workload, had their not_before pass within
   * the last `windowMs` (database clock): retries that just became claimable.
   */
  async function dueRetries(windowMs: number): Promise<Map<string, number>> {
    const rows = await q.retriesDueByWorkload().execute({ ms: Math.round(windowMs) });
    const due = new Map(rows.map((r) => [r.workload, r.n]));
    // Tasks that fell due keep their place in the claim order, maybe ahead
    // of the first ready task a claim batch found (sql/claim-batch.sql).
    if (rows.length > 0) await rowsOf(db, sql`select nextval('meshwork_ready_epoch')`);
    // And the rate-limited tasks whose bucket just refilled.
    for (const r of await preparedRowsOf<{ workload: string; n: number | string }>(
      db,
      "meshwork_rate_refills",
      rateRefillsByWorkload(windowMs),
    )) {
      due.set(r.workload, (due.get(r.workload) ?? 0) + asNumber(r.n));
    }
    return due;
  }

  return {
    /**
     * Leases up to `max` claimable tasks to the worker, best first (the
     * rules are in sql/claim.sql), and counts the slots it has
     * left after them, in one statement shared with the claims made at the
     * same time. Concurrent claimers take disjoint tasks; a drained or
     * unknown worker gets none.
     */
    claimCounted,

    /** The tasks of claimCounted, without the count. */
    async claim(worker: ClaimingWorker, max: number): Promise<ClaimedRow[]> {
      return (await claimCounted(worker, max)).rows;
    },

    /**
     * The worker's cap for a claim (its override, else the registered
     * max_concurrency) and the slots it leaves free now: what a claim
     * response reports after its claims.
     */
    slots(worker: ClaimingWorker) {
      return slots(worker);
    },

    /**
     * Returns expired ASSIGNED/RUNNING tasks to PENDING, or FAILED with
     * LEASE_EXPIRED when their attempts are used up; never overwrites a
     * completion that committed first. A pass that left none behind (fewer
     * than `limit`) moves `sweep` to the database time it began at, less
     * the margin (claim.ts, ExpirySweep).
     *
     * `fromMark`: only leases that expired since `sweep`'s mark, the pass
     * the sweeper makes most seconds (leases/sweeper.ts). Behind a
     * transaction held open, a pass from the first walked the index entry
     * of every lease granted since, each of them; from the mark it walks
     * the last few seconds'. A lease that expired before the mark and is
     * still there is the next whole pass's.
     */
    async expireLeases(limit: number, fromMark = false): Promise<{ id: string; state: string }[]> {
      // ISO 8601 whatever the session's DateStyle (JSON's form of a timestamptz).
      const [began] = sweep
        ? await preparedRowsOf<{ t: string }>(
            db,
            "meshwork_sweep_began",
            sql`select to_json(now() - ${sweepMargin}::interval) #>> '{}' as t`,
          )
        : [];
      const from = fromMark ? (sweep?.sweptTo ?? null) : null;
      const rows = await q.expire().execute({ limit, from });
      if (sweep && began && rows.length < limit) sweep.sweptTo = began.t;
      return rows;
    },

    /**
     * Fails the live attempts that ran past their task's timeout_seconds
     * (TIMEOUT): PENDING after the backoff while attempts remain, else FAILED.
     */
    timeoutAttempts(limit: number): Promise<{ id: string; state: string }[]> {
      return q.timeout().execute({ limit });
    },

    /** Fails PENDING tasks whose deadline has passed (DEADLINE_EXCEEDED). */
    async failPastDeadline(limit: number): Promise<string[]> {
      const rows = await q.failPastDeadline().execute({ limit });
      return rows.map((r) => r.id);
    },

    dueRetries,

    /**
     * Whether a PENDING task's not_before passed within the last `windowMs`
     * (database clock): a retry just became claimable.
     */
    async retriesDue(windowMs: number): Promise<boolean> {
      const rows = await q.retryDue().execute({ ms: Math.round(windowMs) });
      return rows.length > 0;
    },

    /** ASSIGNED → RUNNING for the lease holder (push mode); again RUNNING when already started. */
    async start(l: LeaseRef): Promise<TaskRow> {
      const [row] = await q.start().execute(leaseParams(l));
      return row ?? refuse(l);
    },

    /** Renews one lease: expires_at = now() + (extend_seconds or lease_seconds); the task as renewed. */
    async renew(
      l: LeaseRef,
      extendSeconds: number | undefined,
      progress: Progress | undefined,
    ): Promise<TaskRow> {
      const [row] = await q.renew().execute({
        ...leaseParams(l),
        extend: extendSeconds ?? null,
        steps: progress?.completedSteps ?? null,
        message: progress?.message ?? null,
      });
      return row ?? refuse(l);
    },

    /**
     * Renews a worker's leases in one statement (one StreamLeases message).
     * Answers each in order with its new expiry or why it is lost.
     */
    async renewMany(
      workerId: string,
      items: { taskId: string; attempt: number; token: string; progress?: Progress | undefined }[],
    ): Promise<Outcome<Date>[]> {
      if (items.length === 0) return [];
      const json = JSON.stringify(
        byTaskId(items).map((i) => ({
          id: i.taskId,
          attempt: i.attempt,
          token: i.token,
          steps: i.progress?.completedSteps ?? null,
          message: i.progress?.message ?? null,
        })),
      );
      // A renewal is safe to send again; a deadlock victim is retried once
      // rather than ending the worker's stream (its lease would run out).
      const renewed = await retryOnce(isDeadlock, () =>
        q.renewMany().execute({ items: json, worker: workerId }),
      );
      const byId = new Map(renewed.map((r) => [r.id, r]));
      const renewedItem = (i: (typeof items)[number]) => byId.get(i.taskId)?.attempt === i.attempt;
      const lost = items.filter((i) => !renewedItem(i)).map((i) => ({ ...i, workerId }));
      const verdicts = await judgeAgain(lost);
      let next = 0;
      return items.map((i) => {
        const r = byId.get(i.taskId);
        if (r && renewedItem(i)) return { ok: r.expiresAt as Date };
        const l = lost[next] as LeaseRef;
        return { error: leaseRefusal(verdicts[next++], l) };
      });
    },

    /**
     * Completes attempts: the accepted ones in one statement, each judged on
     * its own. An identical repeat of an accepted completion succeeds again
     * (`repeat`: it changed nothing, and the metrics count it apart); a
     * different manifest for the same attempt is `already_exists`.
     */
    async complete(items: Completion[]): Promise<Outcome[]> {
      if (items.length === 0) return [];
      const hashes = items.map(completionHash);
      const hashOf = new Map(items.map((c, i) => [c, hashes[i]]));
      // Only the keys an item needs: the recordset converts each key it is
      // given with its column's input function, and an empty metrics map
      // is jsonb parsed again per item. A missing key reads as NULL (the
      // statement writes '' and {} for summary and metrics); a batch of 32
      // bare completions unpacks in about a ninth of the time.
      const json = JSON.stringify(
        byTaskId(items).map((c) => ({
          id: c.taskId,
          attempt: c.attempt,
          worker_id: c.workerId,
          token: c.token,
          hash: hashOf.get(c),
          ...(c.result !== null && { result: c.result }),
          ...(c.summary !== "" && { summary: c.summary }),
          ...(!isEmpty(c.metrics) && { metrics: c.metrics }),
          ...(c.value != null && { value: c.value }),
        })),
      );
      const done = await q.complete().execute({ items: json });
      scheduling?.ended(done);
      const byId = new Map(done.map((r) => [r.id, r]));
      // The row the statement completed for this item: the task's attempt
      // and holder are the item's (the lease check matched them).
      const answered = (c: Completion) => {
        const r = byId.get(c.taskId);
        return r && r.attempt === c.attempt && r.leaseWorkerId === c.workerId ? r : undefined;
      };
      // Every other item is explained by the database's verdict on its task now.
      const others = items.filter((c) => !answered(c));
      const verdicts = new Map(
        (await judgeAgain(others)).map((j, k) => [others[k] as Completion, j]),
      );
      // The first item of a task the statement completed is the completion;
      // any other (a repeat in the same batch, or of an earlier call) is a repeat.
      const completedHere = new Set(byId.keys());
      return items.map((c, i) => {
        const found = verdicts.get(c);
        const row = answered(c) ?? (found?.verdict === "COMPLETED" ? found.row : undefined);
        if (row) {
          if (row.completionHash === hashes[i]) {
            return { ok: row, repeat: !completedHere.delete(c.taskId) };
          }
          return {
            error: new DomainError(
              "already_exists",
              "COMPLETION_CONFLICT",
              `attempt ${c.attempt} of task ${c.taskId} was already completed with a different manifest`,
              { taskId: c.taskId, currentAttempt: row.attempt },
            ),
          };
        }
        // The lease holds, so the result artifact was what the statement refused.
        if (c.result && found && found.verdict === null) {
          return {
            error: new DomainError(
              "aborted",
              "ARTIFACT_MISMATCH",
              `result artifact ${c.result.artifactId} is not an artifact of attempt ${c.attempt} of task ${c.taskId} with sha256 ${c.result.sha256}`,
              { taskId: c.taskId, currentAttempt: found.row.attempt },
            ),
          };
        }
        return { error: leaseRefusal(found, c) };
      });
    },

    /**
     * Records a failed attempt: PENDING again with not_before = now() +
     * backoff while it is retryable and attempts remain, else FAILED.
     */
    async fail(l: LeaseRef, code: string, message: string, retryable: boolean): Promise<TaskRow> {
      const [row] = await q.fail().execute({ ...leaseParams(l), code, message, retryable });
      if (row) scheduling?.ended([row]);
      return row ?? refuse(l);
    },

    /** Gives the task back (PENDING) without counting a failure, keeping the checkpoint. */
    async release(l: LeaseRef, checkpointHandle: string): Promise<TaskRow> {
      const [row] = await q.release().execute({ ...leaseParams(l), checkpoint: checkpointHandle });
      if (row) scheduling?.ended([row]);
      return row ?? refuse(l);
    },

    /**
     * The lease a token names on a task (a lease-bound RPC named by
     * task_id and lease_token alone, as the director's REST contract names
     * leases): its holder and attempt, or null when the
     * token is not the task's lease token; nothing about the lease is told
     * before its token is shown. `not_found` for no such task. Whether the
     * lease is live is for the RPC it maps to, which checks everything again.
     */
    async leaseByToken(
      taskId: string,
      token: string,
    ): Promise<{ workerId: string; attempt: number } | null> {
      // A token with U+0000 names no lease, and PostgreSQL cannot take it
      // as text: the task is still looked up (not_found stays not_found),
      // the token is not sent.
      const sendable = !token.includes("\u0000");
      const [row] = await q.leaseByToken().execute({ id: taskId, token: sendable ? token : "" });
      if (!row) throw notFound(`task ${taskId}`, { taskId });
      return sendable && row.same && row.workerId
        ? { workerId: row.workerId, attempt: row.attempt }
        : null;
    },

    /** Releases every task leased to a worker (deregistration): PENDING, attempt kept, no failure counted. */
    async releaseWorker(workerId: string): Promise<string[]> {
      const rows = await releaseWorker(db, workerId);
      return rows.map((r) => r.id);
    },
  };
}

export type LeaseStore = ReturnType<typeof createLeaseStore>;
