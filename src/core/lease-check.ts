import { eq, getTableColumns, type SQL, sql } from "drizzle-orm";
import type { Db } from "../db/database.js";
import { type TaskRow, tasks } from "../db/schema/index.js";
import { DomainError, notFound } from "./errors.js";
import type { LeaseRef } from "./lease-ref.js";
import type { ReasonOf } from "./refusals.js";

/**
 * The lease check, written once, in SQL (src/leases/sql/live-lease.sql):
 * `meshwork_lease_held` says whether a request holds the lease on a task,
 * on the database clock, and `meshwork_lease_verdict` why not. A
 * lease-bound request is accepted only if, in the statement that acts on
 * it, it holds: the task is ASSIGNED or RUNNING, the attempt is the
 * current one, the worker holds the lease, the lease is live, and the
 * token matches when one was sent. A refusal is explained from the verdict
 * the database gave on the row it read, never judged again here.
 */

/** The values of a lease-bound request as SQL: placeholders for one request, columns of a `jsonb_to_recordset` for a batch. */
export interface LeaseRefSql {
  id: SQL;
  attempt: SQL;
  worker: SQL;
  token: SQL;
}

/** Why `ref` does not hold the lease on the row of `tasks` at hand (a reason), or NULL when it does. */
export function leaseVerdictBy(ref: Omit<LeaseRefSql, "id">): SQL<string | null> {
  return sql<
    string | null
  >`meshwork_lease_verdict(${tasks}, ${ref.attempt}, ${ref.worker}, ${ref.token})`;
}

/** The lease check as a WHERE: the row is `ref`'s task and `ref` holds its lease. */
export function leaseHeldBy(ref: LeaseRefSql): SQL {
  return sql`${tasks.id} = ${ref.id}
    and meshwork_lease_held(${tasks}, ${ref.attempt}, ${ref.worker}, ${ref.token})`;
}

const p = sql.placeholder;

const oneRequest: LeaseRefSql = {
  id: sql`${p("id")}::uuid`,
  attempt: sql`${p("attempt")}::int`,
  worker: sql`${p("worker")}::uuid`,
  token: sql`${p("token")}::text`,
};

/** The lease check of one request, with placeholders `id`, `attempt`, `worker`, `token` (see leaseParams). */
export const leaseHeld = leaseHeldBy(oneRequest);

/** The verdict of one request, with the placeholders of `leaseHeld`. */
export const leaseVerdict = leaseVerdictBy(oneRequest);

/** The placeholder values of `leaseHeld` for a request. */
export function leaseParams(l: LeaseRef) {
  return { id: l.taskId, attempt: l.attempt, worker: l.workerId, token: l.token };
}

/** A task row as read to explain a refusal, and the database's verdict on the request. */
export interface Judged {
  row: TaskRow;
  /** Why the request does not hold the lease (live-lease.sql), null when it does. */
  verdict: string | null;
}

/** A row read with a `verdict` column, as a Judged. */
export function judged<T extends TaskRow & { verdict: string | null }>(r: T): Judged {
  const { verdict, ...row } = r;
  return { row, verdict };
}

/**
 * The refusal of a request the statement did not accept, worded from the
 * verdict the database gave on `found` (undefined: no such task). Each
 * refusal's message is written here only. A verdict of "holds" (null) on
 * the row as read means the lease ran out between the statement and the
 * read: LEASE_EXPIRED.
 */
export function leaseRefusal(found: Judged | undefined, l: LeaseRef): DomainError {
  if (!found) return notFound(`task ${l.taskId}`, { taskId: l.taskId });
  const { row, verdict } = found;
  const refuse = (reason: ReasonOf<"aborted">, message: string) =>
    new DomainError("aborted", reason, message, {
      taskId: row.id,
      currentAttempt: row.attempt,
    });
  switch (verdict) {
    case "TASK_CANCELED":
      return refuse("TASK_CANCELED", `task ${row.id} was cancelled`);
    case "STALE_ATTEMPT":
      return refuse(
        "STALE_ATTEMPT",
        `attempt ${l.attempt} of task ${row.id} is stale: the current attempt is ${row.attempt}`,
      );
    case "FOREIGN_WORKER":
      return refuse(
        "FOREIGN_WORKER",
        `attempt ${l.attempt} of task ${row.id} is leased to another worker`,
      );
    case "TIMEOUT":
      return refuse(
        "TIMEOUT",
        `attempt ${l.attempt} of task ${row.id} ran past the task's timeout of ${row.timeoutSeconds ?? 0} s and was failed`,
      );
    case "NOT_LEASED":
    case "COMPLETED":
      return refuse(
        "NOT_LEASED",
        `task ${row.id} is ${row.state}: attempt ${l.attempt} holds no lease`,
      );
    case "TOKEN_MISMATCH":
      return refuse(
        "TOKEN_MISMATCH",
        `the lease token does not match attempt ${l.attempt} of task ${row.id}`,
      );
    default:
      return refuse("LEASE_EXPIRED", `the lease on attempt ${l.attempt} of task ${row.id} expired`);
  }
}

/** Reads the task of `l` with the verdict on `l`, and words the refusal (for a request a statement refused). */
export async function readLeaseRefusal(db: Db, l: LeaseRef): Promise<DomainError> {
  const [found] = await db
    .select({ ...getTableColumns(tasks), verdict: leaseVerdictBy(oneRequestValues(l)) })
    .from(tasks)
    .where(eq(tasks.id, l.taskId));
  return leaseRefusal(found && judged(found), l);
}

function oneRequestValues(l: LeaseRef): Omit<LeaseRefSql, "id"> {
  return {
    attempt: sql`${l.attempt}::int`,
    worker: sql`${l.workerId}::uuid`,
    token: sql`${l.token}::text`,
  };
}
