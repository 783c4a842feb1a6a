import { createHash } from "node:crypto";
import { inArray, sql } from "drizzle-orm";
import { canonicalJson } from "../core/canonical-json.js";
import { DomainError, invalid, notFound } from "../core/errors.js";
import { newTaskId } from "../core/ids.js";
import type { Db } from "../db/database.js";
import {
  type ArtifactRefJson,
  artifacts,
  type PreferenceJson,
  type RequirementJson,
  type Resources,
  type TaskRow,
  taskDependencies,
  tasks,
} from "../db/schema/index.js";
import { resolveDependencies, type WorkflowFields } from "./dependencies.js";
import { insertTasks, type TaskInsert } from "./insert.js";

/** A validated, defaulted task to create. */
export interface NewTask extends WorkflowFields {
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
  /** The schedule whose tick creates it (schedules/), if any. */
  scheduleId?: string | null;
  /** Whether a push placement of it is delivered by the coordinator (fleet/dispatch.ts). */
  dispatch?: boolean;
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
  // The workflow fields count the same way: only when set.
  if (t.runAt !== null) out.runAt = t.runAt.toISOString();
  if (t.delayMs !== null) out.delayMs = t.delayMs;
  if (t.ref !== "") out.ref = t.ref;
  if (t.dependsOn.length > 0) out.dependsOn = t.dependsOn;
  if (t.dependencyPolicy !== "ALL_SUCCEEDED") out.dependencyPolicy = t.dependencyPolicy;
  if (t.timeoutSeconds !== null) out.timeoutSeconds = t.timeoutSeconds;
  if (t.dispatch === true) out.dispatch = true;
  return out;
}

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
    runAt: _ra,
    delayMs: _d,
    ref: _re,
    dependsOn: _do,
    dependencyPolicy: _dp,
    timeoutSeconds: _ts,
    scheduleId: _si,
    dispatch: _di,
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

type Tx = Parameters<Parameters<Db["transaction"]>[0]>[0];

const terminal = ["SUCCEEDED", "FAILED", "CANCELED"];

/**
 * Creates tasks in one transaction, all or none, returned in input order.
 * A task whose idempotency key exists returns the existing task when the
 * request is the same, else the whole call is `already_exists`.
 *
 * A task with dependencies is inserted waiting (not_before 'infinity'),
 * then, once the ids of the call are known (a repeated task of the call is
 * the one made before), gets its edges and its count of dependencies not
 * finished; one already claimable at insert time would be woken before its
 * edges exist. The existing tasks it names are locked FOR SHARE until the
 * commit: none can finish unseen by tasks/sql/dependencies.sql meanwhile.
 */
export async function createTasks(db: Db, input: NewTask[]): Promise<TaskRow[]> {
  const ids = input.map((t) => t.id ?? newTaskId());
  const deps = resolveDependencies(
    input.map((t, i) => ({ id: ids[i] as string, ref: t.ref, dependsOn: t.dependsOn })),
  );
  const values: TaskInsert[] = input.map((t, i) => ({
    id: ids[i] as string,
    task: t,
    requestHash: t.idempotencyKey === null ? null : requestHash(t),
  }));
  const unkeyed = input.every((t) => t.idempotencyKey === null);
  const waits = deps.some((d) => d.length > 0);
  const inputIds = [...new Set(input.flatMap((t) => (t.input ? [t.input.artifactId] : [])))];
  if (unkeyed && !waits && inputIds.length === 0) {
    return inOrder(values, await insertTasks(db, values, false));
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
    const rows = unkeyed
      ? inOrder(values, await insertTasks(tx, values, false))
      : await insertKeyed(tx, values);
    if (!waits) return rows;
    return link(tx, rows, values, deps);
  });
}

/** Inserts tasks with idempotency keys: a repeat returns the task made before. */
async function insertKeyed(tx: Tx, values: TaskInsert[]): Promise<TaskRow[]> {
  const byId = await insertTasks(tx, values, true);
  const missingKeys = values
    .filter((v) => !byId.has(v.id) && v.task.idempotencyKey !== null)
    .map((v) => v.task.idempotencyKey as string);
  const existing =
    missingKeys.length === 0
      ? []
      : await tx.select().from(tasks).where(inArray(tasks.idempotencyKey, missingKeys));
  const byKey = new Map(existing.map((r) => [r.idempotencyKey, r]));
  for (const r of byId.values()) if (r.idempotencyKey) byKey.set(r.idempotencyKey, r);
  return values.map((v) => {
    const key = v.task.idempotencyKey;
    const row = byId.get(v.id) ?? (key ? byKey.get(key) : undefined);
    if (!row) throw new Error("task neither inserted nor found");
    if (row.id !== v.id && row.requestHash !== v.requestHash) {
      throw new DomainError(
        "already_exists",
        "IDEMPOTENCY_KEY_REUSED",
        `idempotency_key ${JSON.stringify(key)} was used for a different request (task ${row.id})`,
        { taskId: row.id },
      );
    }
    return row;
  });
}

/**
 * The edges and counts of the tasks this call inserted (a repeated task
 * keeps what it had), then the release of those whose dependencies have
 * all finished, and the failure (DEPENDENCY_FAILED) of those an
 * ALL_SUCCEEDED dependency already failed, down the call's graph.
 */
async function link(
  tx: Tx,
  rows: TaskRow[],
  values: { id: string }[],
  deps: string[][],
): Promise<TaskRow[]> {
  // A reference to a task of the call is to the row it got (a repeat's is older).
  const actual = new Map(values.map((v, i) => [v.id, rows[i]?.id ?? v.id]));
  const fresh = new Set(rows.filter((r, i) => r.id === values[i]?.id).map((r) => r.id));
  // One edge per pair: `ref:x` and the id of x's task made before (a
  // repeat) name the same task.
  const edges = rows.flatMap((r, i) =>
    fresh.has(r.id)
      ? [...new Set((deps[i] ?? []).map((d) => actual.get(d) ?? d))].map((d) => ({
          taskId: r.id,
          dependsOn: d,
        }))
      : [],
  );
  if (edges.length === 0) return rows;
  const named = [...new Set(edges.map((e) => e.dependsOn).filter((d) => !fresh.has(d)))];
  const states = new Map<string, string>();
  for (let i = 0; i < named.length; i += 1000) {
    const found = await tx
      .select({ id: tasks.id, state: tasks.state })
      .from(tasks)
      .where(inArray(tasks.id, named.slice(i, i + 1000)))
      .for("share");
    for (const f of found) states.set(f.id, f.state);
  }
  const unknown = named.find((d) => !states.has(d));
  if (unknown) throw invalid(`depends_on: no task ${unknown}`);
  for (let i = 0; i < edges.length; i += 5000) {
    await tx
      .insert(taskDependencies)
      .values(edges.slice(i, i + 5000))
      .onConflictDoNothing();
  }
  const pending = new Map<string, number>();
  for (const e of edges) {
    const open = fresh.has(e.dependsOn) || !terminal.includes(states.get(e.dependsOn) ?? "");
    pending.set(e.taskId, (pending.get(e.taskId) ?? 0) + (open ? 1 : 0));
  }
  const counts = JSON.stringify([...pending].map(([id, n]) => ({ id, n })));
  await tx.execute(sql`
    UPDATE tasks t SET
      depends_on = (SELECT array_agg(d.depends_on) FROM task_dependencies d WHERE d.task_id = t.id),
      dependencies_pending = c.n,
      not_before = CASE WHEN c.n > 0 THEN 'infinity'::timestamptz ELSE t.run_at END
    FROM jsonb_to_recordset(${counts}::jsonb) AS c(id uuid, n int)
    WHERE t.id = c.id`);
  const failed = named.filter((d) => ["FAILED", "CANCELED"].includes(states.get(d) ?? ""));
  if (failed.length > 0) {
    await tx.execute(sql`SELECT meshwork_dependencies_fail(${`{${failed.join(",")}}`}::uuid[])`);
  }
  const changed = await tx
    .select()
    .from(tasks)
    .where(inArray(tasks.id, [...pending.keys()]));
  const byId = new Map(changed.map((r) => [r.id, r]));
  return rows.map((r) => byId.get(r.id) ?? r);
}

/** The inserted rows, in the order the request gave the tasks. */
function inOrder(values: { id: string }[], byId: Map<string, TaskRow>): TaskRow[] {
  return values.map((v) => {
    const row = byId.get(v.id);
    if (!row) throw new Error("inserted task missing from RETURNING");
    return row;
  });
}
