import { createHash, timingSafeEqual } from "node:crypto";
import { and, eq, getTableColumns, inArray, type SQL, type SQLWrapper, sql } from "drizzle-orm";
import type { Db } from "../db/database.js";
import { StoreError } from "../db/errors.js";
import { type ArtifactRefJson, type TaskRow, tasks } from "../db/schema/index.js";
import { activeStates, canonicalJson, stateIs } from "../tasks/store.js";

/** What a lease-bound request names: (task_id, attempt) held by worker_id, maybe with its token. */
export interface LeaseRef {
  taskId: string;
  workerId: string;
  attempt: number;
  /** Empty when the caller did not send one. */
  token: string;
}

export interface Progress {
  completedSteps: number;
  message: string;
}

export interface Completion extends LeaseRef {
  result: ArtifactRefJson | null;
  summary: string;
  metrics: Record<string, number>;
}

/** The outcome of one item of a batch: the task, or why it was refused. */
export type Outcome<T = TaskRow> = { ok: T } | { error: StoreError };

export interface ClaimingWorker {
  id: string;
  capabilities: string[];
  labels: Record<string, string>;
}

/** A 256-bit random token from the database's CSPRNG (gen_random_uuid). */
export const newToken = sql`replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '')`;

/** Failures counted against max_attempts: attempts minus those given back by release. */
const failures = sql`(${tasks.attempt} - ${tasks.releases})`;

const p = sql.placeholder;

/**
 * The lease check of SPEC section 3, as a WHERE clause on one row, with
 * placeholders `id`, `attempt`, `worker` and `token` ("" when not sent).
 */
export const leaseHeld = and(
  sql`${tasks.id} = ${p("id")}::uuid`,
  stateIs("ASSIGNED", "RUNNING"),
  sql`${tasks.attempt} = ${p("attempt")}::int`,
  sql`${tasks.leaseWorkerId} = ${p("worker")}::uuid`,
  sql`${tasks.leaseExpiresAt} > now()`,
  sql`(${p("token")}::text = '' or ${tasks.leaseToken} = ${p("token")}::text)`,
);

export function leaseParams(l: LeaseRef) {
  return { id: l.taskId, attempt: l.attempt, worker: l.workerId, token: l.token };
}

/** Builds a prepared statement on first use: Drizzle's query building costs more than the query. */
function once<T>(build: () => T): () => T {
  let built: T | undefined;
  return () => {
    built ??= build();
    return built;
  };
}

/**
 * A FROM item of the ids a `SKIP LOCKED` select picked, computed once.
 * MATERIALIZED matters: the planner may rescan a plain subquery once per
 * outer row, and each rescan skips the rows this statement already updated,
 * so a claim of `max` tasks took more (seen here; Oban warns of the same).
 * A materialized CTE is computed once and rewound on rescan.
 */
function picked(select: SQLWrapper): SQL {
  return sql`(with c as materialized (${select}) select id from c) as picked`;
}

/** The manifest identity of a completion: a repeat with the same hash is the same completion. */
export function completionHash(c: Completion): string {
  return createHash("sha256")
    .update(canonicalJson({ result: c.result, summary: c.summary, metrics: c.metrics }))
    .digest("hex");
}

function sameToken(a: string, b: string | null): boolean {
  if (b === null) return false;
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/**
 * Why a lease-bound request matched no row, decided from the row as it is
 * now. The check itself ran in the conditional UPDATE; this only names the
 * reason (SPEC section 3).
 */
export function leaseRefusal(row: TaskRow | undefined, l: LeaseRef): StoreError {
  if (!row) {
    return new StoreError("not_found", "NOT_FOUND", `task ${l.taskId} not found`, {
      taskId: l.taskId,
    });
  }
  const details = { taskId: row.id, currentAttempt: row.attempt };
  const refuse = (reason: string, message: string) =>
    new StoreError("aborted", reason, message, details);
  if (row.state === "CANCELED") return refuse("TASK_CANCELED", `task ${row.id} was cancelled`);
  if (row.attempt !== l.attempt) {
    return refuse(
      "STALE_ATTEMPT",
      `attempt ${l.attempt} of task ${row.id} is stale: the current attempt is ${row.attempt}`,
    );
  }
  if (row.leaseWorkerId !== l.workerId) {
    return refuse(
      "FOREIGN_WORKER",
      `attempt ${l.attempt} of task ${row.id} is leased to another worker`,
    );
  }
  if (!activeStates.includes(row.state)) {
    if (row.errorCode === "LEASE_EXPIRED" && row.state === "PENDING") {
      return refuse("LEASE_EXPIRED", `the lease on attempt ${l.attempt} of task ${row.id} expired`);
    }
    return refuse(
      "NOT_LEASED",
      `task ${row.id} is ${row.state}: attempt ${l.attempt} holds no lease`,
    );
  }
  if (l.token !== "" && !sameToken(l.token, row.leaseToken)) {
    return refuse(
      "TOKEN_MISMATCH",
      `the lease token does not match attempt ${l.attempt} of task ${row.id}`,
    );
  }
  return refuse("LEASE_EXPIRED", `the lease on attempt ${l.attempt} of task ${row.id} expired`);
}

/** Whether `l` held the lease on `row` when it was read (the UPDATE decided; this names why it refused). */
function leaseLooksHeld(row: TaskRow, l: LeaseRef): boolean {
  return (
    activeStates.includes(row.state) &&
    row.attempt === l.attempt &&
    row.leaseWorkerId === l.workerId &&
    (l.token === "" || sameToken(l.token, row.leaseToken)) &&
    (row.leaseExpiresAt?.getTime() ?? 0) > Date.now()
  );
}

/**
 * Every lease transition: claims, renewals, completions, failures, releases,
 * expiry. The hot statements are prepared once per store (named
 * `meshwork_*`): building a Drizzle query cost ~5× the query itself.
 */
export function createLeaseStore(db: Db) {
  const columns = getTableColumns(tasks);
  const q = {
    row: once(() =>
      db
        .select()
        .from(tasks)
        .where(sql`${tasks.id} = ${p("id")}::uuid`)
        .prepare("meshwork_task_row"),
    ),
    claim: once(() => {
      const caps = sql`${p("caps")}::text[]`;
      // max_tasks, bounded by the worker's free slots: max_concurrency minus
      // the live leases it holds, pulled or pushed.
      const slots = sql`least(${p("max")}::int, greatest(0,
        (select w.max_concurrency from workers w where w.id = ${p("worker")}::uuid)
        - (select count(*)::int from tasks t where t.lease_worker_id = ${p("worker")}::uuid
            and t.state in ('ASSIGNED', 'RUNNING') and t.lease_expires_at > now())))`;
      const matches = and(
        sql`(${tasks.deadline} is null or ${tasks.deadline} > now())`,
        sql`${tasks.workload} = any(${caps})`,
        sql`${tasks.requiredCapabilities} <@ ${caps}`,
        sql`${tasks.affinity} <@ ${p("labels")}::jsonb`,
      );
      const order = sql`priority desc nulls last, deadline asc nulls last, created_at asc`;
      const key = {
        id: tasks.id,
        priority: tasks.priority,
        deadline: tasks.deadline,
        createdAt: tasks.createdAt,
      };
      // PENDING candidates come from meshwork_claim_candidates (migration
      // 0002), whose plan is pinned to the ordered index scan.
      const pending = sql`select task_id as id, task_priority as priority, task_deadline as deadline,
        task_created_at as created_at from meshwork_claim_candidates(${caps}, ${p("labels")}::jsonb, ${slots})`;
      // Leases that ran out are claimable at once, without waiting for the
      // sweeper (those out of attempts are left to it, to be FAILED).
      const expired = db
        .select(key)
        .from(tasks)
        .where(
          and(
            stateIs("ASSIGNED", "RUNNING"),
            sql`${tasks.leaseExpiresAt} <= now()`,
            sql`${failures} < ${tasks.maxAttempts}`,
            matches,
          ),
        )
        .orderBy(tasks.leaseExpiresAt)
        .limit(p("max"))
        .for("update", { skipLocked: true });
      const wasExpired = sql`${tasks.state} <> 'PENDING'`;
      return (
        db
          .update(tasks)
          .set({
            state: "RUNNING",
            attempt: sql`${tasks.attempt} + 1`,
            leaseWorkerId: sql`${p("worker")}::uuid`,
            leaseToken: newToken,
            leaseExpiresAt: sql`now() + make_interval(secs => ${tasks.leaseSeconds})`,
            errorCode: sql`case when ${wasExpired} then 'LEASE_EXPIRED' else ${tasks.errorCode} end`,
            errorMessage: sql`case when ${wasExpired} then 'the lease on attempt ' || ${tasks.attempt} || ' expired' else ${tasks.errorMessage} end`,
            assignedWorkerId: null,
            assignedApiBaseUrl: "",
            notBefore: null,
            cancelRequested: false,
            startedAt: sql`coalesce(${tasks.startedAt}, now())`,
            updatedAt: sql`now()`,
          })
          // Both candidate sets are MATERIALIZED (see `picked`); the best
          // `max` of them are taken.
          .from(
            sql`(with pending as materialized (${pending}), expired as materialized (${expired})
            select id from (select * from pending union all select * from expired) candidates
            order by ${order} limit ${slots}) as picked`,
          )
          .where(
            and(
              sql`${tasks.id} = picked.id`,
              sql`(${stateIs("PENDING")} or (${stateIs("ASSIGNED", "RUNNING")} and ${tasks.leaseExpiresAt} <= now()))`,
              // The worker exists and is not drained, checked in the same statement.
              sql`exists (select 1 from workers w where w.id = ${p("worker")}::uuid and not w.drained)`,
            ),
          )
          .returning(columns)
          .prepare("meshwork_claim")
      );
    }),
    expire: once(() => {
      const expired = db
        .select({ id: tasks.id })
        .from(tasks)
        .where(and(stateIs("ASSIGNED", "RUNNING"), sql`${tasks.leaseExpiresAt} <= now()`))
        .orderBy(tasks.leaseExpiresAt)
        .limit(p("limit"))
        .for("update", { skipLocked: true });
      const exhausted = sql`${failures} >= ${tasks.maxAttempts}`;
      return db
        .update(tasks)
        .set({
          state: sql`case when ${exhausted} then 'FAILED' else 'PENDING' end`,
          errorCode: "LEASE_EXPIRED",
          errorMessage: sql`'the lease on attempt ' || ${tasks.attempt} || ' expired'`,
          finishedAt: sql`case when ${exhausted} then now() end`,
          assignedWorkerId: null,
          assignedApiBaseUrl: "",
          updatedAt: sql`now()`,
        })
        .from(picked(expired))
        .where(
          and(
            sql`${tasks.id} = picked.id`,
            stateIs("ASSIGNED", "RUNNING"),
            sql`${tasks.leaseExpiresAt} <= now()`,
          ),
        )
        .returning({ id: tasks.id, state: tasks.state })
        .prepare("meshwork_expire_leases");
    }),
    renew: once(() =>
      db
        .update(tasks)
        .set({
          leaseExpiresAt: sql`now() + make_interval(secs => coalesce(${p("extend")}::int, ${tasks.leaseSeconds}))`,
          progressSteps: sql`coalesce(${p("steps")}::int, ${tasks.progressSteps})`,
          progressMessage: sql`coalesce(${p("message")}::text, ${tasks.progressMessage})`,
          updatedAt: sql`now()`,
        })
        .where(leaseHeld)
        .returning({ expiresAt: tasks.leaseExpiresAt, cancelRequested: tasks.cancelRequested })
        .prepare("meshwork_renew"),
    ),
    renewMany: once(() =>
      db
        .update(tasks)
        .set({
          leaseExpiresAt: sql`now() + make_interval(secs => ${tasks.leaseSeconds})`,
          progressSteps: sql`coalesce(v.steps, ${tasks.progressSteps})`,
          progressMessage: sql`coalesce(v.message, ${tasks.progressMessage})`,
          updatedAt: sql`now()`,
        })
        .from(
          sql`jsonb_to_recordset(${p("items")}::jsonb) as v(id uuid, attempt int, token text, steps int, message text)`,
        )
        .where(
          sql`${tasks.id} = v.id and ${stateIs("ASSIGNED", "RUNNING")} and ${tasks.attempt} = v.attempt
            and ${tasks.leaseWorkerId} = ${p("worker")}::uuid and ${tasks.leaseExpiresAt} > now()
            and (v.token = '' or ${tasks.leaseToken} = v.token)`,
        )
        .returning({ id: tasks.id, attempt: tasks.attempt, expiresAt: tasks.leaseExpiresAt })
        .prepare("meshwork_renew_many"),
    ),
    complete: once(() =>
      db
        .update(tasks)
        .set({
          state: "SUCCEEDED",
          // The stored result is the coordinator's record of the artifact.
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
          sql`${tasks.id} = v.id and ${stateIs("ASSIGNED", "RUNNING")} and ${tasks.attempt} = v.attempt
            and ${tasks.leaseWorkerId} = v.worker_id and ${tasks.leaseExpiresAt} > now()
            and (v.token = '' or ${tasks.leaseToken} = v.token)
            and (v.result is null or exists (select 1 from artifacts a
              where a.id = (v.result->>'artifactId')::uuid and a.task_id = v.id
              and a.attempt = v.attempt and a.sha256 = v.result->>'sha256'))`,
        )
        .returning(columns)
        .prepare("meshwork_complete"),
    ),
    fail: once(() => {
      const retry = sql`(${p("retryable")}::boolean and ${failures} < ${tasks.maxAttempts})`;
      const backoffMs = sql`least(${tasks.backoffMaxMs}, ${tasks.backoffInitialMs} * power(${tasks.backoffMultiplier}, greatest(${failures} - 1, 0)))`;
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
    release: once(() =>
      db
        .update(tasks)
        .set({
          state: "PENDING",
          releases: sql`${tasks.releases} + 1`,
          checkpointHandle: sql`${p("checkpoint")}::text`,
          notBefore: null,
          assignedWorkerId: null,
          assignedApiBaseUrl: "",
          updatedAt: sql`now()`,
        })
        .where(leaseHeld)
        .returning(columns)
        .prepare("meshwork_release"),
    ),
  };

  async function rowsById(ids: string[]): Promise<Map<string, TaskRow>> {
    if (ids.length === 0) return new Map();
    const rows = await db.select().from(tasks).where(inArray(tasks.id, ids));
    return new Map(rows.map((r) => [r.id, r]));
  }

  async function refuse(l: LeaseRef): Promise<never> {
    const [row] = await q.row().execute({ id: l.taskId });
    throw leaseRefusal(row, l);
  }

  return {
    /**
     * Leases up to `max` claimable tasks to the worker in one statement:
     * PENDING (past not_before, before deadline), workload and required
     * capabilities advertised, affinity ⊆ labels; highest priority, then
     * earliest deadline, then oldest. `SKIP LOCKED` lets concurrent claimers
     * take disjoint rows. The worker's max_concurrency bounds what it holds,
     * claimed and placed together. A task whose lease ran out is claimable at once
     * under its next attempt, without waiting for the sweeper.
     */
    async claim(worker: ClaimingWorker, max: number): Promise<TaskRow[]> {
      const rows = await q.claim().execute({
        caps: worker.capabilities,
        labels: JSON.stringify(worker.labels),
        max,
        worker: worker.id,
      });
      return rows.sort(claimOrder);
    },

    /**
     * Returns expired ASSIGNED/RUNNING tasks to PENDING, or FAILED with
     * LEASE_EXPIRED when their attempts are used up. The UPDATE re-checks
     * state and expiry, so a completion that committed first is never overwritten.
     */
    async expireLeases(limit: number): Promise<{ id: string; state: string }[]> {
      return q.expire().execute({ limit });
    },

    /** Fails PENDING tasks whose deadline has passed (DEADLINE_EXCEEDED). */
    async failPastDeadline(limit: number): Promise<string[]> {
      const due = db
        .select({ id: tasks.id })
        .from(tasks)
        .where(and(stateIs("PENDING"), sql`${tasks.deadline} <= now()`))
        .limit(limit)
        .for("update", { skipLocked: true });
      const rows = await db
        .update(tasks)
        .set({
          state: "FAILED",
          errorCode: "DEADLINE_EXCEEDED",
          errorMessage: "the deadline passed before the task could run",
          finishedAt: sql`now()`,
          updatedAt: sql`now()`,
        })
        .from(picked(due))
        .where(
          and(sql`${tasks.id} = picked.id`, stateIs("PENDING"), sql`${tasks.deadline} <= now()`),
        )
        .returning({ id: tasks.id });
      return rows.map((r) => r.id);
    },

    /**
     * Whether a PENDING task's not_before passed within the last `windowMs`
     * (database clock): a retry just became claimable.
     */
    async retriesDue(windowMs: number): Promise<boolean> {
      const [row] = await db
        .select({ id: tasks.id })
        .from(tasks)
        .where(
          and(
            stateIs("PENDING"),
            sql`${tasks.notBefore} > now() - make_interval(secs => ${windowMs / 1000})`,
            sql`${tasks.notBefore} <= now()`,
          ),
        )
        .limit(1);
      return row !== undefined;
    },

    /** ASSIGNED → RUNNING for the lease holder (push mode). */
    async start(l: LeaseRef): Promise<TaskRow> {
      const [row] = await db
        .update(tasks)
        .set({
          state: "RUNNING",
          startedAt: sql`coalesce(${tasks.startedAt}, now())`,
          updatedAt: sql`now()`,
        })
        .where(and(leaseHeld, stateIs("ASSIGNED")))
        .returning()
        .execute(leaseParams(l));
      return row ?? refuse(l);
    },

    /** Renews one lease: expires_at = now() + (extend_seconds or lease_seconds). */
    async renew(
      l: LeaseRef,
      extendSeconds: number | undefined,
      progress: Progress | undefined,
    ): Promise<{ expiresAt: Date; cancelRequested: boolean }> {
      const [row] = await q.renew().execute({
        ...leaseParams(l),
        extend: extendSeconds ?? null,
        steps: progress?.completedSteps ?? null,
        message: progress?.message ?? null,
      });
      if (!row) return refuse(l);
      return { expiresAt: row.expiresAt as Date, cancelRequested: row.cancelRequested };
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
        items.map((i) => ({
          id: i.taskId,
          attempt: i.attempt,
          token: i.token,
          steps: i.progress?.completedSteps ?? null,
          message: i.progress?.message ?? null,
        })),
      );
      const renewed = await q.renewMany().execute({ items: json, worker: workerId });
      const byId = new Map(renewed.map((r) => [r.id, r]));
      const lost = items.filter((i) => byId.get(i.taskId)?.attempt !== i.attempt);
      const rows = await rowsById([...new Set(lost.map((i) => i.taskId))]);
      return items.map((i) => {
        const r = byId.get(i.taskId);
        if (r && r.attempt === i.attempt) return { ok: r.expiresAt as Date };
        return { error: leaseRefusal(rows.get(i.taskId), { ...i, workerId }) };
      });
    },

    /**
     * Completes attempts: the accepted ones in one statement, each judged on
     * its own. An identical repeat of an accepted completion succeeds again;
     * a different manifest for the same attempt is `already_exists`.
     */
    async complete(items: Completion[]): Promise<Outcome[]> {
      if (items.length === 0) return [];
      const hashes = items.map(completionHash);
      const json = JSON.stringify(
        items.map((c, i) => ({
          id: c.taskId,
          attempt: c.attempt,
          worker_id: c.workerId,
          token: c.token,
          result: c.result,
          summary: c.summary,
          metrics: c.metrics,
          hash: hashes[i],
        })),
      );
      const done = await q.complete().execute({ items: json });
      const byId = new Map(done.map((r) => [r.id, r]));
      const unsettled = items.filter((c, i) => byId.get(c.taskId)?.completionHash !== hashes[i]);
      const current = await rowsById(
        [...new Set(unsettled.map((c) => c.taskId))].filter((id) => !byId.has(id)),
      );
      return items.map((c, i) => {
        const row = byId.get(c.taskId) ?? current.get(c.taskId);
        if (
          row?.state === "SUCCEEDED" &&
          row.attempt === c.attempt &&
          row.leaseWorkerId === c.workerId
        ) {
          if (row.completionHash === hashes[i]) return { ok: row };
          return {
            error: new StoreError(
              "already_exists",
              "COMPLETION_CONFLICT",
              `attempt ${c.attempt} of task ${c.taskId} was already completed with a different manifest`,
              { taskId: c.taskId, currentAttempt: row.attempt },
            ),
          };
        }
        if (c.result && row && leaseLooksHeld(row, c)) {
          return {
            error: new StoreError(
              "aborted",
              "ARTIFACT_MISMATCH",
              `result artifact ${c.result.artifactId} is not an artifact of attempt ${c.attempt} of task ${c.taskId} with sha256 ${c.result.sha256}`,
              { taskId: c.taskId, currentAttempt: row.attempt },
            ),
          };
        }
        return { error: leaseRefusal(row, c) };
      });
    },

    /**
     * Records a failed attempt: PENDING again with not_before = now() +
     * backoff while it is retryable and attempts remain, else FAILED.
     */
    async fail(l: LeaseRef, code: string, message: string, retryable: boolean): Promise<TaskRow> {
      const [row] = await q.fail().execute({ ...leaseParams(l), code, message, retryable });
      return row ?? refuse(l);
    },

    /** Gives the task back (PENDING) without counting a failure, keeping the checkpoint. */
    async release(l: LeaseRef, checkpointHandle: string): Promise<TaskRow> {
      const [row] = await q.release().execute({ ...leaseParams(l), checkpoint: checkpointHandle });
      return row ?? refuse(l);
    },

    /** Releases every live lease of a worker (deregistration): PENDING, attempt kept, no failure counted. */
    async releaseWorker(workerId: string): Promise<string[]> {
      const rows = await db
        .update(tasks)
        .set({
          state: "PENDING",
          releases: sql`${tasks.releases} + 1`,
          notBefore: null,
          assignedWorkerId: null,
          assignedApiBaseUrl: "",
          updatedAt: sql`now()`,
        })
        .where(and(eq(tasks.leaseWorkerId, workerId), stateIs("ASSIGNED", "RUNNING")))
        .returning({ id: tasks.id });
      return rows.map((r) => r.id);
    },
  };
}

export type LeaseStore = ReturnType<typeof createLeaseStore>;

function claimOrder(a: TaskRow, b: TaskRow): number {
  if (a.priority !== b.priority) return b.priority - a.priority;
  const da = a.deadline?.getTime() ?? Number.POSITIVE_INFINITY;
  const db = b.deadline?.getTime() ?? Number.POSITIVE_INFINITY;
  if (da !== db) return da - db;
  return a.createdAt.getTime() - b.createdAt.getTime();
}
