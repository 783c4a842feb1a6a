import { and, type SQL, sql } from "drizzle-orm";
import { stateIs } from "../../core/task-sql.js";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";
import { asNumber } from "../../db/values.js";

/**
 * Retries that just became claimable: a failed attempt's backoff
 * (not_before) passing changes no row, so nothing NOTIFYs; the sweeper
 * asks these to wake parked claims (leases/sweeper.ts).
 */

const p = sql.placeholder;

/** PENDING with a not_before that passed within the last `ms` milliseconds (database clock). */
const retryDueWithin = and(
  stateIs("PENDING"),
  sql`${tasks.notBefore} > now() - make_interval(secs => ${p("ms")}::int / 1000.0)`,
  sql`${tasks.notBefore} <= now()`,
);

/** A PENDING task whose not_before passed within the last `ms` milliseconds. */
export function retryDueStatement(db: Db) {
  return db
    .select({ id: tasks.id })
    .from(tasks)
    .where(retryDueWithin)
    .limit(1)
    .prepare("meshwork_retry_due");
}

/** The PENDING tasks whose not_before passed within the last `ms` milliseconds, counted by workload. */
export function retriesDueByWorkloadStatement(db: Db) {
  return db
    .select({ workload: tasks.workload, n: sql<number>`count(*)::int`.mapWith(asNumber) })
    .from(tasks)
    .where(retryDueWithin)
    .groupBy(tasks.workload)
    .limit(1000)
    .prepare("meshwork_retries_due_by_workload");
}

/**
 * Rate-limited tasks that just became claimable: a rate_key's bucket
 * (scheduling/sql/limits.sql) refilling to a whole token changes no row
 * either. Counted by workload: as many as the buckets hold tokens (at most
 * the PENDING tasks of each key), for the buckets that reached a token
 * within the last `windowMs`.
 */
export function rateRefillsByWorkload(windowMs: number): SQL {
  return sql`select t.workload, least(count(*), floor(meshwork_rate_tokens(r)))::int as n
    from rate_limits r join tasks t on t.rate_key = r.key
    where t.state = 'PENDING' and t.rate_key <> ''
      and meshwork_rate_tokens(r) >= 1
      and least(r.burst::float8, r.tokens + r.per_second
        * (extract(epoch from now() - r.refilled_at) - ${windowMs / 1000}::float8)) < 1
    group by t.workload, r.key
    limit 1000`;
}
