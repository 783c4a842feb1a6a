import { getTableColumns, sql } from "drizzle-orm";
import { leaseVerdict, leaseVerdictBy } from "../../core/lease-check.js";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";
import { asBoolean } from "../../db/values.js";

/**
 * The reads after a refusal. A lease transition is one conditional UPDATE
 * whose zero rows mean "refused"; only then is the task read once more,
 * with the database's verdict on the request (meshwork_lease_verdict,
 * live-lease.sql), so that the refusal is named from what the database
 * judged, on its clock, never judged again in TypeScript.
 */

const p = sql.placeholder;
const columns = getTableColumns(tasks);

/** A refused request's task, with the database's verdict on it (core/lease-check.ts words it). */
export function judgedStatement(db: Db) {
  return db
    .select({ ...columns, verdict: leaseVerdict })
    .from(tasks)
    .where(sql`${tasks.id} = ${p("id")}::uuid`)
    .prepare("meshwork_lease_judged");
}

/**
 * The same for the items of a batch (`i`: the item's index), each judged on
 * its own values. From tasks first: the statement's name in the metrics is
 * the table it reads (db/observe.ts names the first FROM), not the function
 * that unpacks the items.
 */
export function judgedManyStatement(db: Db) {
  return db
    .select({
      ...columns,
      verdict: leaseVerdictBy({
        attempt: sql`v.attempt`,
        worker: sql`v.worker`,
        token: sql`v.token`,
      }),
      i: sql<number>`v.i`,
    })
    .from(tasks)
    .innerJoin(
      sql`jsonb_to_recordset(${p("items")}::jsonb) as v(i int, id uuid, attempt int, worker uuid, token text)`,
      sql`${tasks.id} = v.id`,
    )
    .prepare("meshwork_lease_judged_many");
}

/** The holder and attempt of a task's lease, and whether `token` is its token (leaseByToken). */
export function leaseByTokenStatement(db: Db) {
  return db
    .select({
      workerId: tasks.leaseWorkerId,
      attempt: tasks.attempt,
      same: sql<boolean>`coalesce(${tasks.leaseToken} = ${p("token")}::text, false)`.mapWith(
        asBoolean,
      ),
    })
    .from(tasks)
    .where(sql`${tasks.id} = ${p("id")}::uuid`)
    .prepare("meshwork_lease_by_token");
}
