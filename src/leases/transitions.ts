import { and, getTableColumns, type SQL, type SQLWrapper, sql } from "drizzle-orm";
import { leaseHeld, leaseHeldBy, leaseVerdict, leaseVerdictBy } from "../core/lease-check.js";
import { expiresIn, stateIs } from "../core/task-sql.js";
import type { Db } from "../db/database.js";
import { lazy } from "../db/lazy.js";
import { tasks } from "../db/schema/index.js";

/**
 * The lease transitions other than the claim (claim.ts): renewals,
 * completions, failures, releases, expiry. Each is one conditional UPDATE
 * whose WHERE is the lease check (lease-check.ts) or the expiry rule, so that
 * zero rows is the answer "refused" and nothing is read first.
 */

const p = sql.placeholder;

/**
 * "The row is one of those a `SKIP LOCKED` select picked", reaching them by
 * primary key: `id = any(array(...))`, as the claim does (migration 0006).
 * Never `UPDATE ... FROM picked`: without fresh statistics that was planned
 * as a hash join over a bitmap of every row matching the condition, 20,000
 * rows read to update 1,000 from a backlog (test/postgres/sweeper-plan.test.ts).
 * MATERIALIZED matters too: the planner may rescan a plain subquery once per
 * outer row, and each rescan skips the rows this statement already updated,
 * so an UPDATE of `limit` rows took more (seen here on the claim).
 */
function pickedBy(select: SQLWrapper): SQL {
  return sql`${tasks.id} = any(array(with c as materialized (${select}) select id from c))`;
}

/** A lease given back without counting a failure (ReleaseTask, DeregisterWorker). */
export const released = {
  state: "PENDING",
  releases: sql`${tasks.releases} + 1`,
  notBefore: null,
  assignedWorkerId: null,
  assignedApiBaseUrl: "",
  updatedAt: sql`now()`,
} as const;

/** Backoff before retry n (n = failures so far): initial × multiplier^(n−1), capped at max. */
const backoffMs = sql`least(${tasks.backoffMaxMs},
  ${tasks.backoffInitialMs} * power(${tasks.backoffMultiplier}, greatest(${tasks.failures} - 1, 0)))`;

/** Expired leases (live-lease.sql, the one definition): for the sweeper. */
const expiredLease = sql`meshwork_lease_expired(${tasks})`;

/** The prepared transition statements of one database handle. */
export function createTransitions(db: Db) {
  const columns = getTableColumns(tasks);
  /** PENDING with a not_before that passed within the last `ms` milliseconds (database clock). */
  const retryDueWithin = and(
    stateIs("PENDING"),
    sql`${tasks.notBefore} > now() - make_interval(secs => ${p("ms")}::int / 1000.0)`,
    sql`${tasks.notBefore} <= now()`,
  );

  return {
    /** A refused request's task, with the database's verdict on it (core/lease-check.ts words it). */
    judged: lazy(() =>
      db
        .select({ ...columns, verdict: leaseVerdict })
        .from(tasks)
        .where(sql`${tasks.id} = ${p("id")}::uuid`)
        .prepare("meshwork_lease_judged"),
    ),

    /** The same for the items of a batch (`i`: the item's index), each judged on its own values. */
    judgedMany: lazy(() =>
      db
        .select({
          ...columns,
          verdict: leaseVerdictBy({
            attempt: sql`v.attempt`,
            worker: sql`v.worker`,
            token: sql`v.token`,
          }),
          i: sql<number>`v.i`,
        })
        .from(
          sql`jsonb_to_recordset(${p("items")}::jsonb) as v(i int, id uuid, attempt int, worker uuid, token text)`,
        )
        .innerJoin(tasks, sql`${tasks.id} = v.id`)
        .prepare("meshwork_lease_judged_many"),
    ),

    start: lazy(() =>
      db
        .update(tasks)
        .set({
          state: "RUNNING",
          startedAt: sql`coalesce(${tasks.startedAt}, now())`,
          updatedAt: sql`now()`,
        })
        // RUNNING already under the same lease: started again, so a retried
        // StartTask succeeds (the lease check admits ASSIGNED and RUNNING).
        .where(leaseHeld)
        .returning(columns)
        .prepare("meshwork_start"),
    ),

    renew: lazy(() =>
      db
        .update(tasks)
        .set({
          leaseExpiresAt: expiresIn(sql`coalesce(${p("extend")}::int, ${tasks.leaseSeconds})`),
          progressSteps: sql`coalesce(${p("steps")}::int, ${tasks.progressSteps})`,
          progressMessage: sql`coalesce(${p("message")}::text, ${tasks.progressMessage})`,
          updatedAt: sql`now()`,
        })
        .where(leaseHeld)
        .returning({ expiresAt: tasks.leaseExpiresAt, cancelRequested: tasks.cancelRequested })
        .prepare("meshwork_renew"),
    ),

    /** One StreamLeases message: every lease of one worker renewed in one statement. */
    renewMany: lazy(() =>
      db
        .update(tasks)
        .set({
          leaseExpiresAt: expiresIn(tasks.leaseSeconds),
          progressSteps: sql`coalesce(v.steps, ${tasks.progressSteps})`,
          progressMessage: sql`coalesce(v.message, ${tasks.progressMessage})`,
          updatedAt: sql`now()`,
        })
        .from(
          sql`jsonb_to_recordset(${p("items")}::jsonb) as v(id uuid, attempt int, token text, steps int, message text)`,
        )
        .where(
          leaseHeldBy({
            id: sql`v.id`,
            attempt: sql`v.attempt`,
            worker: sql`${p("worker")}::uuid`,
            token: sql`v.token`,
          }),
        )
        .returning({ id: tasks.id, attempt: tasks.attempt, expiresAt: tasks.leaseExpiresAt })
        .prepare("meshwork_renew_many"),
    ),

    /**
     * Completions, each judged on its own, applied in one statement. A result
     * must be an artifact of this task and attempt with the sha256 sent; the
     * stored result is the coordinator's record of it.
     */
    complete: lazy(() =>
      db
        .update(tasks)
        .set({
          state: "SUCCEEDED",
          result: sql`case when v.result is null then null else (
            select jsonb_build_object('artifactId', a.id, 'uri', v.result->>'uri', 'sha256', a.sha256,
              'sizeBytes', a.size_bytes, 'contentType', a.content_type)
            from artifacts a where a.id = (v.result->>'artifactId')::uuid) end`,
          resultSummary: sql`v.summary`,
          metrics: sql`v.metrics`,
          completionHash: sql`v.hash`,
          errorCode: "",
          errorMessage: "",
          finishedAt: sql`now()`,
          updatedAt: sql`now()`,
        })
        .from(
          sql`jsonb_to_recordset(${p("items")}::jsonb) as v(id uuid, attempt int, worker_id uuid, token text, result jsonb, summary text, metrics jsonb, hash text)`,
        )
        .where(
          and(
            leaseHeldBy({
              id: sql`v.id`,
              attempt: sql`v.attempt`,
              worker: sql`v.worker_id`,
              token: sql`v.token`,
            }),
            sql`(v.result is null or exists (select 1 from artifacts a
              where a.id = (v.result->>'artifactId')::uuid and a.task_id = v.id
              and a.attempt = v.attempt and a.sha256 = v.result->>'sha256'))`,
          ),
        )
        .returning(columns)
        .prepare("meshwork_complete"),
    ),

    /** PENDING after a backoff while retryable with attempts left, else FAILED. */
    fail: lazy(() => {
      const retry = sql`(${p("retryable")}::boolean and ${tasks.failures} < ${tasks.maxAttempts})`;
      return db
        .update(tasks)
        .set({
          state: sql`case when ${retry} then 'PENDING' else 'FAILED' end`,
          notBefore: sql`case when ${retry} then now() + ${backoffMs} * interval '1 millisecond' end`,
          finishedAt: sql`case when ${retry} then null else now() end`,
          errorCode: sql`${p("code")}::text`,
          errorMessage: sql`${p("message")}::text`,
          assignedWorkerId: null,
          assignedApiBaseUrl: "",
          updatedAt: sql`now()`,
        })
        .where(leaseHeld)
        .returning(columns)
        .prepare("meshwork_fail");
    }),

    release: lazy(() =>
      db
        .update(tasks)
        .set({ ...released, checkpointHandle: sql`${p("checkpoint")}::text` })
        .where(leaseHeld)
        .returning(columns)
        .prepare("meshwork_release"),
    ),

    /**
     * Expired leases back to PENDING, or FAILED when attempts are used up.
     * The UPDATE re-checks the expiry on the locked row, so a completion
     * that committed first is never overwritten.
     */
    expire: lazy(() => {
      const due = db
        .select({ id: tasks.id })
        .from(tasks)
        .where(expiredLease)
        .orderBy(tasks.leaseExpiresAt)
        .limit(p("limit"))
        .for("update", { skipLocked: true });
      const exhausted = sql`${tasks.failures} >= ${tasks.maxAttempts}`;
      return db
        .update(tasks)
        .set({
          state: sql`case when ${exhausted} then 'FAILED' else 'PENDING' end`,
          errorCode: "LEASE_EXPIRED",
          errorMessage: sql`meshwork_expiry_message(${tasks.attempt})`,
          finishedAt: sql`case when ${exhausted} then now() end`,
          assignedWorkerId: null,
          assignedApiBaseUrl: "",
          updatedAt: sql`now()`,
        })
        .where(and(pickedBy(due), expiredLease))
        .returning({ id: tasks.id, state: tasks.state })
        .prepare("meshwork_expire_leases");
    }),

    /** PENDING tasks whose deadline passed → FAILED (DEADLINE_EXCEEDED). */
    failPastDeadline: lazy(() => {
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
    }),

    /** A PENDING task whose not_before passed within the last `ms` milliseconds. */
    retryDue: lazy(() =>
      db
        .select({ id: tasks.id })
        .from(tasks)
        .where(retryDueWithin)
        .limit(1)
        .prepare("meshwork_retry_due"),
    ),

    /** The PENDING tasks whose not_before passed within the last `ms` milliseconds, counted by workload. */
    retriesDueByWorkload: lazy(() =>
      db
        .select({ workload: tasks.workload, n: sql<number>`count(*)::int` })
        .from(tasks)
        .where(retryDueWithin)
        .groupBy(tasks.workload)
        .limit(1000)
        .prepare("meshwork_retries_due_by_workload"),
    ),
  };
}
