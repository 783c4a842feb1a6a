import { getTableColumns, sql } from "drizzle-orm";
import type { Db } from "../db/database.js";
import { type TaskRow, tasks } from "../db/schema/index.js";
import { preparedRowsOf, rowReader } from "../db/values.js";
import type { NewTask } from "./create.js";

// The insert of a CreateTasks call: one statement whose rows travel as ONE
// JSON parameter, unpacked by jsonb_to_recordset, instead of a VALUES list
// of ~35 parameters per task. Building and binding that list cost the
// coordinator ~0.3 ms of CPU per task (Drizzle builds a node per value,
// postgres.js encodes each parameter), more than PostgreSQL's insert; the
// JSON text costs a few microseconds per task and PostgreSQL parses it in C.

/** A task's row as the statement's JSON parameter carries it (snake_case, the recordset's columns). */
export interface TaskInsert {
  id: string;
  task: NewTask;
  requestHash: string | null;
}

/** The recordset's columns: each as the JSON parameter names it, with its type. */
const recordColumns = `
  id uuid, name text, workload text, required_capabilities text[], affinity jsonb,
  priority int, deadline timestamptz, parameters jsonb, input jsonb, steps int,
  max_attempts int, lease_seconds int, backoff_initial_ms int, backoff_max_ms int,
  backoff_multiplier float8, idempotency_key text, request_hash text, correlation_id text,
  trace_parent text, trace_state text, resources jsonb, requirements jsonb, preferences jsonb,
  share text, concurrency_key text, rate_key text, run_at timestamptz, delay_ms bigint,
  waits boolean, ref text, dependency_policy text, timeout_seconds int, schedule_id uuid,
  dispatch boolean`;

/**
 * What the insert returns: the columns the row reader maps, by name. The
 * statement is prepared, and `RETURNING *` would tie its result type to
 * the table's columns as they are when it was prepared: a column added
 * since (a newer replica's migration, in a rolling upgrade) fails the next
 * run on each connection with "cached plan must not change result type",
 * which postgres.js cannot run again inside the create's transaction.
 */
const returned = sql.raw(
  Object.values(getTableColumns(tasks))
    .map((column) => `"${column.name}"`)
    .join(", "),
);

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
    SELECT r.id, r.name, r.workload, r.required_capabilities, r.affinity, r.priority, r.deadline,
      r.parameters, r.input, r.steps, 'PENDING', r.max_attempts, r.lease_seconds,
      r.backoff_initial_ms, r.backoff_max_ms, r.backoff_multiplier, r.idempotency_key,
      r.request_hash, r.correlation_id, r.trace_parent, r.trace_state, r.resources,
      r.requirements, r.preferences, r.share, r.concurrency_key, r.rate_key, s.start,
      CASE WHEN r.waits THEN 'infinity'::timestamptz ELSE s.start END,
      r.ref, r.dependency_policy, r.timeout_seconds, r.schedule_id, r.dispatch
    FROM jsonb_to_recordset(${json}::jsonb) AS r(${sql.raw(recordColumns)})
    CROSS JOIN LATERAL (
      SELECT coalesce(r.run_at, now() + r.delay_ms * interval '1 millisecond') AS start) s
    ${conflict}
    RETURNING ${returned}`;
}

function record({ id, task: t, requestHash }: TaskInsert) {
  return {
    id,
    name: t.name,
    workload: t.workload,
    required_capabilities: t.requiredCapabilities,
    affinity: t.affinity,
    priority: t.priority,
    deadline: t.deadline,
    parameters: t.parameters,
    input: t.input,
    steps: t.steps,
    max_attempts: t.maxAttempts,
    lease_seconds: t.leaseSeconds,
    backoff_initial_ms: t.backoff.initialMs,
    backoff_max_ms: t.backoff.maxMs,
    backoff_multiplier: t.backoff.multiplier,
    idempotency_key: t.idempotencyKey,
    request_hash: requestHash,
    correlation_id: t.correlationId,
    trace_parent: t.traceParent,
    trace_state: t.traceState,
    resources: t.resources,
    requirements: t.requirements,
    preferences: t.preferences,
    share: t.share,
    concurrency_key: t.concurrencyKey,
    rate_key: t.rateKey,
    run_at: t.runAt,
    delay_ms: t.delayMs,
    // Inserted waiting for its dependencies (not_before 'infinity'); create.ts sets the counts.
    waits: t.dependsOn.length > 0,
    ref: t.ref,
    dependency_policy: t.dependencyPolicy,
    timeout_seconds: t.timeoutSeconds,
    schedule_id: t.scheduleId ?? null,
    dispatch: t.dispatch ?? false,
  };
}

const readTask = rowReader(tasks);

/**
 * Inserts the tasks in one statement; with `keyed`, a task whose
 * idempotency key exists is skipped (create.ts finds the one made before).
 * Returns the inserted rows, in no particular order.
 */
export async function insertTasks(
  db: Pick<Db, "_">,
  rows: readonly TaskInsert[],
  keyed: boolean,
): Promise<TaskRow[]> {
  // Prepared: the text is one of two (keyed or not), whatever the tasks.
  const raw = await preparedRowsOf<Record<string, unknown>>(
    db,
    keyed ? "meshwork_insert_tasks_keyed" : "meshwork_insert_tasks",
    statement(JSON.stringify(rows.map(record)), keyed),
  );
  return raw.map(readTask);
}
