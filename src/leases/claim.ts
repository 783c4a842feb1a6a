import { eq, getTableColumns, Subquery, sql } from "drizzle-orm";
import { quickestOfLast } from "../core/quickest.js";
import type { Db } from "../db/database.js";
import { type Resources, type TaskRow, tasks, workers } from "../db/schema/index.js";
import { asNumber, asTable } from "../db/values.js";

/**
 * What the share book (scheduling/book.ts) tells a claim: a plan per claim
 * (the shares to serve first) and when to look for a reservation; and what
 * it is told: the leases granted, and those ended by a completion, failure
 * or release through this replica (others count from its next read).
 */
export interface ClaimScheduling {
  plans(maxes: readonly number[]): ({ shares: string[]; seq: number[] } | null)[];
  reserveAfterMs(workerId: string): number | null;
  granted(rows: readonly { share: string; resources: Resources }[]): void;
  ended(rows: readonly { share: string; resources: Resources }[]): void;
}

/** The worker a claim is for, with what it offers this time. */
export interface ClaimingWorker {
  id: string;
  capabilities: string[];
  labels: Record<string, string>;
  /** Stands for the registered max_concurrency in this claim (REST workers state it per claim). */
  maxConcurrency?: number | undefined;
}

const p = sql.placeholder;

/**
 * The columns a claim answers: what a worker's Claim carries, what the
 * claim's caller counts (workload, the share book's share and resources)
 * and whether the task has dependencies (their outputs are read for it);
 * and the lease as the store's callers see it (state, holder, when, and
 * why the attempt before ended, when a claim took it over).
 * Not the whole row: every column answered is written out by the database
 * and parsed by the coordinator, and on PGlite both run on one thread.
 */
const claimedColumns = (() => {
  const c = getTableColumns(tasks);
  return {
    id: c.id,
    state: c.state,
    updatedAt: c.updatedAt,
    leaseWorkerId: c.leaseWorkerId,
    errorCode: c.errorCode,
    errorMessage: c.errorMessage,
    name: c.name,
    workload: c.workload,
    parameters: c.parameters,
    input: c.input,
    steps: c.steps,
    attempt: c.attempt,
    leaseToken: c.leaseToken,
    leaseExpiresAt: c.leaseExpiresAt,
    leaseSeconds: c.leaseSeconds,
    checkpointHandle: c.checkpointHandle,
    correlationId: c.correlationId,
    traceParent: c.traceParent,
    traceState: c.traceState,
    resources: c.resources,
    share: c.share,
    timeoutSeconds: c.timeoutSeconds,
    dependsOn: c.dependsOn,
    // The batch's hint row (claim index -1) carries the hint here.
    progressMessage: c.progressMessage,
  };
})();

/** A claimed task, as a claim answers it (claimedColumns). */
export type ClaimedRow = Pick<TaskRow, keyof typeof claimedColumns>;

/** What one claim got: its tasks, best first, and the worker's slots after them. */
export interface ClaimAnswer {
  rows: ClaimedRow[];
  /** Counted in the same statement (before the claim, plus what it took); undefined for an unknown worker. */
  slots: Slots | undefined;
}

/**
 * Where claims look for expired leases from (claim.sql, `expired_from`):
 * the database time at which the sweeper began its last pass that left no
 * expired lease behind, less `sweepMargin`. One per process, shared by the
 * sweeper's lease store, which moves it, and the claims' (app.ts). Null
 * until a pass has run: claims then look through every expired entry.
 *
 * The margin is for leases moved into the past by hand (tests and
 * operators set lease_expires_at = now() - 1 second to expire one at once):
 * a claim still takes such a lease, though the sweeper passed a moment
 * before. The sweeper's own passes start at the mark too, but once a
 * minute it makes a whole one (leases/sweeper.ts, wholePassMs): a lease
 * that expired before the mark and is still there is put back then.
 * Nothing is lost, only taken up to a minute later.
 */
export interface ExpirySweep {
  sweptTo: string | null;
}

/**
 * How long a claim batch's hint of the first ready task is used, by
 * default, before a batch looks from the head of the claim order again
 * (sql/claim-batch.sql): the longest a task made ready out of the ready
 * epoch's sight (a transaction that moved it committed after a batch's
 * snapshot) waits behind later ones, while looking from the head is cheap.
 */
export const readyHintMs = 1000;

/**
 * A hint is kept for up to `headLookFactor` times as long as the quickest
 * of the last three looks from the head took (but `readyHintMaxMs` at
 * most), so that those looks take at most a fiftieth of the time, or one
 * a minute. They are cheap (well under a millisecond) until entries pile
 * up at the head of the claim order: behind a transaction that pins the
 * xmin horizon, every task claimed since it began leaves a dead one there,
 * and the look walks them all (a second and more after ten minutes of a
 * busy drain); many delayed tasks ahead of the first ready one slow it
 * too. A task out of the epoch's sight then waits up to a minute behind
 * later ones. The quickest of three, so that one slow look (a lock, a
 * stall) does not stretch the hint.
 */
export const headLookFactor = 50;
export const readyHintMaxMs = 60_000;

/** How long a hint found by a look from the head that took `headMs` is kept (at least `leastMs`). */
export function hintLife(headMs: number, leastMs = readyHintMs): number {
  return Math.max(leastMs, Math.min(headLookFactor * headMs, readyHintMaxMs));
}

/** How far before its pass began the sweeper's mark is set. */
export const sweepMargin = "5 seconds";

/**
 * Claims, several in one statement: `meshwork_claim_batch`
 * (sql/claim-batch.sql) runs each through `meshwork_claim` (sql/claim.sql),
 * the single SQL text that says which tasks a
 * worker may take, in which order, and the lease each gets, with the plan
 * decisions that keep it O(claimed) whatever the backlog and the
 * statistics; with each claim it answers the worker's slots left. Rows come
 * back in the function's order (`with ordinality`).
 *
 * Claims go by worker id, so that batches take worker locks in one order.
 * Prepared once per store: building a Drizzle query costs more than the query.
 */
export function createClaimStatement(
  db: Db,
  scheduling?: ClaimScheduling,
  sweep?: ExpirySweep,
  hintMs = readyHintMs,
) {
  const columns = claimedColumns;
  // The function's rows under the table's name, so that Drizzle maps the
  // task's columns exactly as it maps a select from the table.
  const answered = new Subquery(
    sql`select b.claim as claim_index, b.free as claim_free, b.cap as claim_cap, b.ord as claim_ord, (b.task).*
      from meshwork_claim_batch(${p("claims")}::jsonb, ${p("hint")}::jsonb)
        with ordinality as b(claim, free, cap, task, ord)`,
    columns,
    "tasks",
  );
  const statement = db
    .select({
      ...columns,
      claimIndex: sql<number>`tasks.claim_index`,
      claimFree: sql<number | null>`tasks.claim_free`,
      claimCap: sql<number | null>`tasks.claim_cap`,
    })
    .from(asTable(answered, tasks))
    .orderBy(sql`tasks.claim_ord`)
    .prepare("meshwork_claim_batch");
  // The first ready task the last batch found (sql/claim-batch.sql, hint),
  // and when a batch last found it from the head of the claim order.
  let hint: { text: string; since: number; life: number } | undefined;
  // How long the last three looks from the head took.
  const looks = quickestOfLast(3);
  return async (
    claims: readonly { worker: ClaimingWorker; max: number }[],
  ): Promise<ClaimAnswer[]> => {
    const order = claims
      .map((_, i) => i)
      .sort((a, b) => {
        const x = claims[a]?.worker.id ?? "";
        const y = claims[b]?.worker.id ?? "";
        return x < y ? -1 : x > y ? 1 : a - b;
      });
    const plans = scheduling?.plans(order.map((i) => claims[i]?.max ?? 0));
    const sent = performance.now();
    if (hint && sent - hint.since >= hint.life) hint = undefined;
    const used = hint;
    const rows = await statement.execute({
      hint: used?.text ?? null,
      claims: JSON.stringify(
        order.map((i, n) => {
          const { worker, max } = claims[i] as { worker: ClaimingWorker; max: number };
          return {
            worker: worker.id,
            caps: worker.capabilities,
            labels: worker.labels,
            max,
            concurrency: worker.maxConcurrency ?? null,
            plan: plans?.[n] ?? null,
            reserveAfterMs: scheduling?.reserveAfterMs(worker.id) ?? null,
            expiredFrom: sweep?.sweptTo ?? null,
          };
        }),
      ),
    });
    const answers: ClaimAnswer[] = claims.map(() => ({ rows: [], slots: undefined }));
    let next: string | undefined;
    for (const row of rows) {
      if (row.claimIndex === -1) {
        next = row.progressMessage;
        continue;
      }
      const answer = answers[order[row.claimIndex] ?? -1];
      if (!answer) continue;
      // The row as it is, with its three extra fields (a copy without them
      // cost more than the rest of the mapping).
      if (row.claimFree === null || row.claimCap === null) answer.rows.push(row);
      else answer.slots = { free: row.claimFree, maxConcurrency: row.claimCap };
    }
    // A hint found from the head starts a new life, as long as the look
    // allows; one found from the hint sent keeps that one's.
    if (next === undefined) hint = undefined;
    else {
      const found = JSON.parse(next) as { head?: boolean; headMs?: number };
      if (!used || found.head) {
        looks.add(found.headMs ?? 0);
        const life = hintLife(looks.ms(), hintMs);
        hint = { text: next, since: sent, life };
      } else hint = { text: next, since: used.since, life: used.life };
    }
    scheduling?.granted(answers.flatMap((a) => a.rows));
    return answers;
  };
}

/** How a worker's cap stands: the cap that applies and the slots it leaves free. */
export interface Slots {
  /** The cap: the claim's max_concurrency override, else the registered one. */
  maxConcurrency: number;
  /** The cap minus the worker's live leases, never below 0. */
  free: number;
}

/**
 * A worker's free slots, counted now as the claim counts them (the slots
 * its live leases hold, meshwork_allocated: one range of
 * tasks_lease_worker_expiry_idx): what a claim response reports after its
 * claims. An unknown worker has none. Prepared once per store.
 */
export function createSlotsStatement(db: Db) {
  const statement = db
    .select({
      maxConcurrency: workers.maxConcurrency,
      live: sql`coalesce((meshwork_allocated(${workers.id})->>'slots')::int, 0)`.mapWith(asNumber),
    })
    .from(workers)
    .where(eq(workers.id, p("worker")))
    .prepare("meshwork_claim_slots");
  return async (worker: ClaimingWorker): Promise<Slots> => {
    const [row] = await statement.execute({ worker: worker.id });
    const maxConcurrency = worker.maxConcurrency ?? row?.maxConcurrency ?? 0;
    if (!row) return { maxConcurrency, free: 0 };
    return { maxConcurrency, free: Math.max(0, maxConcurrency - row.live) };
  };
}
