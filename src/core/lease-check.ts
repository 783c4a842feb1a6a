import { timingSafeEqual } from "node:crypto";
import { type SQL, sql } from "drizzle-orm";
import { type TaskRow, tasks } from "../db/schema/index.js";
import { DomainError, notFound } from "./errors.js";
import type { LeaseRef } from "./lease-ref.js";
import type { ReasonOf } from "./refusals.js";
import { activeStates, stateIs } from "./task-sql.js";

/**
 * The lease check, written once. A lease-bound request is accepted only if,
 * in the statement that acts on it: the task is ASSIGNED or RUNNING, the
 * attempt is the current one, the worker holds the lease, the lease has not
 * expired (database clock), and the token matches when one was sent.
 *
 * `ref` gives the request's values as SQL: placeholders for one request,
 * columns of a `jsonb_to_recordset` for a batch.
 */
export function leaseHeldBy(ref: { id: SQL; attempt: SQL; worker: SQL; token: SQL }): SQL {
  return sql`${tasks.id} = ${ref.id} and ${stateIs("ASSIGNED", "RUNNING")}
    and ${tasks.attempt} = ${ref.attempt} and ${tasks.leaseWorkerId} = ${ref.worker}
    and ${tasks.leaseExpiresAt} > now()
    and (${ref.token} = '' or ${tasks.leaseToken} = ${ref.token})`;
}

const p = sql.placeholder;

/** The lease check of one request, with placeholders `id`, `attempt`, `worker`, `token` (see leaseParams). */
export const leaseHeld = leaseHeldBy({
  id: sql`${p("id")}::uuid`,
  attempt: sql`${p("attempt")}::int`,
  worker: sql`${p("worker")}::uuid`,
  token: sql`${p("token")}::text`,
});

/** The placeholder values of `leaseHeld` for a request. */
export function leaseParams(l: LeaseRef) {
  return { id: l.taskId, attempt: l.attempt, worker: l.workerId, token: l.token };
}

function sameToken(a: string, b: string | null): boolean {
  if (b === null) return false;
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/**
 * Why `l` does not hold the lease on `row` as read, or undefined when it
 * does. The check itself runs in SQL (leaseHeldBy); this names the reason
 * for a request the statement refused, from the row as it is now.
 */
export function whyNotHeld(row: TaskRow | undefined, l: LeaseRef): DomainError | undefined {
  if (!row) return notFound(`task ${l.taskId}`, { taskId: l.taskId });
  const details = { taskId: row.id, currentAttempt: row.attempt };
  const refuse = (reason: ReasonOf<"aborted">, message: string) =>
    new DomainError("aborted", reason, message, details);
  const expired = () =>
    refuse("LEASE_EXPIRED", `the lease on attempt ${l.attempt} of task ${row.id} expired`);
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
    // The sweeper returned it to PENDING when the lease ran out.
    if (row.errorCode === "LEASE_EXPIRED" && row.state === "PENDING") return expired();
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
  if ((row.leaseExpiresAt?.getTime() ?? 0) <= Date.now()) return expired();
  return undefined;
}

/**
 * The refusal of a request the statement did not accept. When the row as
 * read still looks held, the lease ran out between the statement and the
 * read (or the clocks differ by a hair): LEASE_EXPIRED.
 */
export function leaseRefusal(row: TaskRow | undefined, l: LeaseRef): DomainError {
  return (
    whyNotHeld(row, l) ??
    new DomainError(
      "aborted",
      "LEASE_EXPIRED",
      `the lease on attempt ${l.attempt} of task ${l.taskId} expired`,
      { taskId: l.taskId, currentAttempt: row?.attempt ?? 0 },
    )
  );
}
