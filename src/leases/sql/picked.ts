import { type SQL, type SQLWrapper, sql } from "drizzle-orm";
import { tasks } from "../../db/schema/index.js";

/**
 * "The row is one of those a `SKIP LOCKED` select picked", reaching them by
 * primary key: `id = any(array(...))`, as the claim does (claim.sql).
 * Never `UPDATE ... FROM picked`: without fresh statistics that was planned
 * as a hash join over a bitmap of every row matching the condition, 20,000
 * rows read to update 1,000 from a backlog (test/postgres/sweeper-plan.test.ts).
 * MATERIALIZED matters too: the planner may rescan a plain subquery once per
 * outer row, and each rescan skips the rows this statement already updated,
 * so an UPDATE of `limit` rows took more (seen here on the claim).
 */
export function pickedBy(select: SQLWrapper): SQL {
  return sql`${tasks.id} = any(array(with c as materialized (${select}) select id from c))`;
}
