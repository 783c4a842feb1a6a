import { getTableColumns, type SQL, type SQLWrapper, Subquery, sql } from "drizzle-orm";
import { type Resources, type TaskStateName, tasks } from "../db/schema/index.js";
import { asTable } from "../db/values.js";

/** Every task state, in the order of the state machine. */
export const allStates: readonly TaskStateName[] = [
  "PENDING",
  "ASSIGNED",
  "RUNNING",
  "SUCCEEDED",
  "FAILED",
  "CANCELED",
];

/** The states in which a task holds a lease. */
export const activeStates: readonly TaskStateName[] = ["ASSIGNED", "RUNNING"];

/** The states a task never leaves. */
export const terminalStates: readonly TaskStateName[] = ["SUCCEEDED", "FAILED", "CANCELED"];

/**
 * `state = 'X'` / `state in ('X', 'Y')` with the names as SQL literals, not
 * parameters: the partial indexes (`where state = 'PENDING'`, …) can only
 * be used when the planner sees the literal. With parameters, the generic
 * plan of a prepared statement scans the whole table (seen here: claims 50×
 * slower once PostgreSQL switched to the generic plan).
 */
export function stateIs(...names: TaskStateName[]): SQL {
  const literals = names.map((n) => `'${n}'`).join(", ");
  return names.length === 1
    ? sql`${tasks.state} = ${sql.raw(literals)}`
    : sql`${tasks.state} in (${sql.raw(literals)})`;
}

/** A new lease token (database function, src/leases/sql/token.sql: 64 hex digits from the CSPRNG). */
export const newToken = sql`meshwork_new_token()`;

/**
 * The live leases a worker holds, by the database function the claim uses
 * too (meshwork_live_leases, over the one live-lease rule of
 * src/leases/sql/live-lease.sql).
 * `exceptTask` leaves out a task being re-placed.
 */
export function liveLeases(worker: SQLWrapper, exceptTask?: string): SQL<number> {
  return exceptTask === undefined
    ? sql<number>`meshwork_live_leases(${worker})`
    : sql<number>`meshwork_live_leases(${worker}, ${exceptTask}::uuid)`;
}

/**
 * What a worker's live leases hold, per resource (meshwork_allocated,
 * src/scheduling/sql/resources.sql). `exceptTask` leaves out a task being
 * re-placed.
 */
export function allocatedOf(worker: SQLWrapper, exceptTask?: string): SQL<Resources> {
  return (
    exceptTask === undefined
      ? sql`meshwork_allocated(${worker})`
      : sql`meshwork_allocated(${worker}, ${exceptTask}::uuid)`
  ).mapWith(asResources);
}

/** A jsonb resource map as read (either driver): quantities as numbers. */
export function asResources(value: unknown): Resources {
  const map = (typeof value === "string" ? JSON.parse(value) : value) as Record<string, unknown>;
  return Object.fromEntries(Object.entries(map ?? {}).map(([k, v]) => [k, Number(v)]));
}

/** `expires_at` of a lease of `seconds` from now, on the database clock. */
export function expiresIn(seconds: SQLWrapper): SQL {
  return sql`now() + make_interval(secs => ${seconds})`;
}

/** A push placement's grant: what it writes beside the lease. */
export interface PushGrant {
  leaseSeconds: number;
  /** null: none. */
  scheduleKey: string | null;
  /** Empty: keep the task's. */
  correlationId: string;
}

/**
 * The task `taskId` leased to `worker` by the one grant statement
 * (meshwork_grant, src/leases/sql/grant.sql, which the claim calls too), as
 * a source Drizzle maps as rows of tasks: `tx.select().from(granted(…))`.
 * The caller has locked the task and decided.
 */
export function pushGranted(taskId: string, worker: string, push: PushGrant): typeof tasks {
  return asTable(
    new Subquery(
      sql`select * from meshwork_grant(array[${taskId}::uuid], ${worker}::uuid, true,
        ${push.leaseSeconds}::int, ${push.scheduleKey}::text, ${push.correlationId}::text)`,
      getTableColumns(tasks),
      "tasks",
    ),
    tasks,
  );
}
