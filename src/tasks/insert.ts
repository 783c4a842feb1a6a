import { sql } from "drizzle-orm";
import type { Db } from "../db/database.js";
import { type TaskRow, tasks } from "../db/schema/index.js";
import { preparedRowsOf } from "../db/values.js";
import type { NewTask } from "./create.js";

// The insert of a CreateTasks call: one statement whose rows travel as ONE
// JSON parameter, unpacked by jsonb_to_recordset, instead of a VALUES list
// of ~35 parameters per task. Building and binding that list cost the
// coordinator ~0.3 ms of CPU per task (Drizzle builds a node per value,
// postgres.js encodes each parameter), more than PostgreSQL's insert; the
// JSON text costs a few microseconds per task and PostgreSQL parses it in C.

/** A task to insert: its id, the request, and its request hash (`record` makes its JSON). */
export interface TaskInsert {
  id: string;
  task: NewTask;
  requestHash: string | null;
}

/** The recordset's columns: each as the JSON parameter names it, with its type. */
const recordTypes = {
  id: "uuid",
  name: "text",
  workload: "text",
  required_capabilities: "text[]",
  affinity: "jsonb",
  priority: "int",
  deadline: "timestamptz",
  parameters: "jsonb",
  input: "jsonb",
  steps: "int",
  max_attempts: "int",
  lease_seconds: "int",
  backoff_initial_ms: "int",
  backoff_max_ms: "int",
  backoff_multiplier: "float8",
  idempotency_key: "text",
  request_hash: "text",
  correlation_id: "text",
  trace_parent: "text",
  trace_state: "text",
  resources: "jsonb",
  requirements: "jsonb",
  preferences: "jsonb",
  share: "text",
  concurrency_key: "text",
  rate_key: "text",
  run_at: "timestamptz",
  delay_ms: "bigint",
  waits: "boolean",
  ref: "text",
  dependency_policy: "text",
  timeout_seconds: "int",
  schedule_id: "uuid",
  dispatch: "boolean",
} as const;

type RecordKey = keyof typeof recordTypes;

const recordColumns = Object.entries(recordTypes)
  .map(([key, type]) => `${key} ${type}`)
  .join(", ");

/**
 * What the insert returns: only what PostgreSQL decides, the id (to tell
 * the rows inserted from those an idempotency key skipped) and the times.
 * Every other column of a new row is what the insert wrote or the table's
 * default for a new task, and `written` builds the row from them: parsing
 * the 61 returned columns of every task, jsonb included, and mapping them
 * back cost the coordinator more than any other step of a CreateTasks of
 * 1,000 but garbage collection. test/contract/task-store.test.ts checks
 * that the rows answered equal the rows read back. They are equal as
 * values: a map or Struct answered here keeps the request's key order,
 * where a read gives jsonb's (protobuf and JSON give key order no
 * meaning), and a -0 in `parameters` reads back as 0.
 *
 * Columns named, not `RETURNING *`: the statement is prepared, and a result
 * type tied to the table's columns as they were when it was prepared fails
 * the next run on each connection after a column is added (a newer
 * replica's migration, in a rolling upgrade) with "cached plan must not
 * change result type", which postgres.js cannot run again inside the
 * create's transaction.
 */
const returned = sql.raw("id, created_at, updated_at, run_at, not_before");

/**
 * What a record leaves out, and what the statement writes in its place:
 * each column's usual value for a new task (the request defaults), as a
 * value to compare with and as SQL. A key holding null is left out as
 * well (a missing key reads as NULL). The recordset converts every key it
 * is given with its column type's input function: the text[] and jsonb
 * ones parse their text again. With every key present, unpacking 1,000
 * tasks took ~60 ms of the statement's ~90 (postgres.js, this machine); with
 * only the keys that differ, a bare task carries a third of the bytes and
 * the insert took ~32 ms. Any value would be correct here as long as the
 * two forms agree: these are the ones most tasks hold.
 */
const usual: Partial<Record<RecordKey, readonly [value: unknown, sql: string]>> = {
  name: ["", "''"],
  required_capabilities: [[], "'{}'::text[]"],
  affinity: [{}, "'{}'::jsonb"],
  priority: [0, "0"],
  max_attempts: [3, "3"],
  lease_seconds: [60, "60"],
  backoff_initial_ms: [1000, "1000"],
  backoff_max_ms: [300_000, "300000"],
  backoff_multiplier: [2, "2"],
  trace_state: ["", "''"],
  resources: [{ slots: 1 }, `'{"slots": 1}'::jsonb`],
  requirements: [[], "'[]'::jsonb"],
  preferences: [[], "'[]'::jsonb"],
  share: ["default", "'default'"],
  concurrency_key: ["", "''"],
  rate_key: ["", "''"],
  waits: [false, "false"],
  ref: ["", "''"],
  dependency_policy: ["ALL_SUCCEEDED", "'ALL_SUCCEEDED'"],
  dispatch: [false, "false"],
};

/** Column `key` of the recordset `r`, its usual value in place of a key left out. */
const col = (key: RecordKey): string => {
  const u = usual[key];
  return u ? `coalesce(r.${key}, ${u[1]})` : `r.${key}`;
};

/** The insert's SELECT list, in the order of its column list. */
const selected = sql.raw(`${col("id")}, ${col("name")}, ${col("workload")},
      ${col("required_capabilities")}, ${col("affinity")}, ${col("priority")}, ${col("deadline")},
      ${col("parameters")}, ${col("input")}, ${col("steps")}, 'PENDING', ${col("max_attempts")},
      ${col("lease_seconds")}, ${col("backoff_initial_ms")}, ${col("backoff_max_ms")},
      ${col("backoff_multiplier")}, ${col("idempotency_key")}, ${col("request_hash")},
      ${col("correlation_id")}, ${col("trace_parent")}, ${col("trace_state")},
      ${col("resources")}, ${col("requirements")}, ${col("preferences")}, ${col("share")},
      ${col("concurrency_key")}, ${col("rate_key")}, s.start,
      CASE WHEN ${col("waits")} THEN 'infinity'::timestamptz ELSE s.start END,
      ${col("ref")}, ${col("dependency_policy")}, ${col("timeout_seconds")},
      ${col("schedule_id")}, ${col("dispatch")}`);

/**
 * The insert, with `conflict` (the idempotency key's ON CONFLICT) or
 * without. A delay counts from the statement's now(), as a run_at given
 * by the client counts from its own clock.
 */
function statement(json: string, keyed: boolean) {
  const conflict = keyed
    ? sql` ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING`
    : sql``;
  return sql`
    INSERT INTO tasks (id, name, workload, required_capabilities, affinity, priority, deadline,
      parameters, input, steps, state, max_attempts, lease_seconds, backoff_initial_ms,
      backoff_max_ms, backoff_multiplier, idempotency_key, request_hash, correlation_id,
      trace_parent, trace_state, resources, requirements, preferences, share, concurrency_key,
      rate_key, run_at, not_before, ref, dependency_policy, timeout_seconds, schedule_id, dispatch)
    SELECT ${selected}
    FROM jsonb_to_recordset(${json}::jsonb) AS r(${sql.raw(recordColumns)})
    CROSS JOIN LATERAL (
      SELECT coalesce(r.run_at, now() + r.delay_ms * interval '1 millisecond') AS start) s
    ${conflict}
    RETURNING ${returned}`;
}

/** A task as the statement's JSON parameter carries it: only the keys that differ from `usual`. */
function record({ id, task: t, requestHash }: TaskInsert): Record<string, unknown> {
  const out: Record<string, unknown> = { id, workload: t.workload };
  const put = (key: RecordKey, value: unknown) => {
    if (value === null || value === undefined) return;
    const u = usual[key];
    if (u && isUsual(value, u[0])) return;
    out[key] = value;
  };
  put("name", t.name);
  put("required_capabilities", t.requiredCapabilities);
  put("affinity", t.affinity);
  put("priority", t.priority);
  put("deadline", t.deadline);
  put("parameters", t.parameters);
  put("input", t.input);
  put("steps", t.steps);
  put("max_attempts", t.maxAttempts);
  put("lease_seconds", t.leaseSeconds);
  put("backoff_initial_ms", t.backoff.initialMs);
  put("backoff_max_ms", t.backoff.maxMs);
  put("backoff_multiplier", t.backoff.multiplier);
  put("idempotency_key", t.idempotencyKey);
  put("request_hash", requestHash);
  put("correlation_id", t.correlationId);
  put("trace_parent", t.traceParent);
  put("trace_state", t.traceState);
  put("resources", t.resources);
  put("requirements", t.requirements);
  put("preferences", t.preferences);
  put("share", t.share);
  put("concurrency_key", t.concurrencyKey);
  put("rate_key", t.rateKey);
  put("run_at", t.runAt);
  put("delay_ms", t.delayMs);
  // Inserted waiting for its dependencies (not_before 'infinity'); create.ts sets the counts.
  put("waits", t.dependsOn.length > 0);
  put("ref", t.ref);
  put("dependency_policy", t.dependencyPolicy);
  put("timeout_seconds", t.timeoutSeconds);
  put("schedule_id", t.scheduleId);
  put("dispatch", t.dispatch);
  return out;
}

/**
 * Whether `value` is the usual `expected`: the same primitive, an empty
 * list (the only usual lists), or a map with the same keys and primitive
 * values.
 */
function isUsual(value: unknown, expected: unknown): boolean {
  if (value === expected) return true;
  if (Array.isArray(expected)) return Array.isArray(value) && value.length === 0;
  if (typeof expected !== "object" || expected === null) return false;
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  const want = expected as Record<string, unknown>;
  let keys = 0;
  for (const [k, v] of Object.entries(value)) {
    if (v !== want[k]) return false;
    keys++;
  }
  return keys === Object.keys(want).length;
}

/** The times the insert returns, as the driver gives them. */
interface Returned {
  id: string;
  created_at: unknown;
  updated_at: unknown;
  run_at: unknown;
  not_before: unknown;
}

const time = (value: unknown): Date | null =>
  value === null || value === undefined
    ? null
    : (tasks.createdAt.mapFromDriverValue(value as string) as Date);

/**
 * The row an insert of `v` made, as a read of it would give it: what the
 * insert wrote, the table's defaults for the rest (a new task holds no
 * lease, result, error or progress), and PostgreSQL's times. Typed as the
 * whole row: a column added to the table fails the type-check here until
 * it is given its value for a new task. The row holds the request's own
 * objects (parameters, affinity, lists), not copies: nothing after the
 * insert changes them.
 */
function written({ id, task: t, requestHash }: TaskInsert, at: Returned): TaskRow {
  return {
    id,
    name: t.name,
    workload: t.workload,
    requiredCapabilities: t.requiredCapabilities,
    affinity: t.affinity,
    priority: t.priority,
    deadline: t.deadline,
    parameters: t.parameters,
    input: t.input,
    steps: t.steps,
    state: "PENDING",
    attempt: 0,
    releases: 0,
    failures: 0,
    maxAttempts: t.maxAttempts,
    leaseSeconds: t.leaseSeconds,
    backoffInitialMs: t.backoff.initialMs,
    backoffMaxMs: t.backoff.maxMs,
    backoffMultiplier: t.backoff.multiplier,
    idempotencyKey: t.idempotencyKey,
    requestHash,
    correlationId: t.correlationId,
    traceParent: t.traceParent,
    traceState: t.traceState,
    assignedWorkerId: null,
    assignedApiBaseUrl: "",
    scheduleIdempotencyKey: null,
    leaseWorkerId: null,
    leaseToken: null,
    leaseExpiresAt: null,
    checkpointHandle: "",
    progressSteps: 0,
    progressMessage: "",
    result: null,
    resultSummary: "",
    metrics: {},
    completionHash: null,
    errorCode: "",
    errorMessage: "",
    cancelRequested: false,
    notBefore: time(at.not_before),
    createdAt: time(at.created_at) as Date,
    updatedAt: time(at.updated_at) as Date,
    startedAt: null,
    finishedAt: null,
    resources: t.resources,
    requirements: t.requirements,
    preferences: t.preferences,
    share: t.share,
    concurrencyKey: t.concurrencyKey,
    rateKey: t.rateKey,
    runAt: time(at.run_at),
    ref: t.ref,
    // The edges and counts come after the insert (create.ts), which reads the rows again.
    dependsOn: [],
    dependencyPolicy: t.dependencyPolicy,
    dependenciesPending: 0,
    timeoutSeconds: t.timeoutSeconds,
    attemptDeadline: null,
    resultValue: null,
    scheduleId: t.scheduleId ?? null,
    dispatch: t.dispatch ?? false,
  };
}

/**
 * Inserts the tasks in one statement; with `keyed`, a task whose
 * idempotency key exists is skipped (create.ts finds the one made before).
 * Returns the inserted rows by id (a skipped task has none).
 */
export async function insertTasks(
  db: Pick<Db, "_">,
  rows: readonly TaskInsert[],
  keyed: boolean,
): Promise<Map<string, TaskRow>> {
  // Prepared: the text is one of two (keyed or not), whatever the tasks.
  const inserted = await preparedRowsOf<Returned>(
    db,
    keyed ? "meshwork_insert_tasks_keyed" : "meshwork_insert_tasks",
    statement(JSON.stringify(rows.map(record)), keyed),
  );
  const given = new Map(rows.map((r) => [r.id, r]));
  const byId = new Map<string, TaskRow>();
  for (const at of inserted) {
    const row = given.get(at.id);
    if (!row) throw new Error("the insert returned a task it was not given");
    byId.set(at.id, written(row, at));
  }
  return byId;
}
