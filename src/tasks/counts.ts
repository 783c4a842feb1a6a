import { desc, type SQL, sql } from "drizzle-orm";
import { unionAll } from "drizzle-orm/pg-core";
import { stateIs } from "../core/task-sql.js";
import type { Db } from "../db/database.js";
import { type Resources, type TaskStateName, tasks } from "../db/schema/index.js";
import { asNumber, rowsOf } from "../db/values.js";

/**
 * What the metrics and the fleet overview count of the tasks: by state, the
 * live ones by workload, the PENDING backlog. Read-only; part of the task
 * store (createTaskStore spreads them in), kept apart from its writes.
 */
export function createTaskCounts(db: Db) {
  return {
    /** Task counts by state (states with no task are absent). */
    async countByState(): Promise<Map<TaskStateName, number>> {
      const rows = await db
        .select({ state: tasks.state, count: sql<number>`count(*)::int` })
        .from(tasks)
        .groupBy(tasks.state);
      return new Map(rows.map((r) => [r.state, asNumber(r.count)]));
    },

    /**
     * Non-terminal tasks by workload and state, with the age in seconds of
     * the oldest PENDING one (database clock), for the metrics. Two groups
     * read through the partial indexes of live rows (tasks_claim_idx for
     * PENDING; one of those `where state in ('ASSIGNED', 'RUNNING')` for the
     * leased), so the cost follows the backlog and the leases held, not the
     * finished history (PostgreSQL 15, 200,000 rows of which 4,000 live:
     * two index scans, 23 ms).
     */
    async liveByWorkload(): Promise<
      { workload: string; state: string; count: number; oldestSeconds: number | null }[]
    > {
      const group = (where: SQL, age: boolean) =>
        db
          .select({
            workload: tasks.workload,
            state: tasks.state,
            count: sql<number>`count(*)::int`,
            oldestSeconds: age
              ? sql<number | null>`extract(epoch from now() - min(${tasks.createdAt}))::float8`
              : sql<number | null>`null::float8`,
          })
          .from(tasks)
          .where(where)
          .groupBy(tasks.workload, tasks.state);
      const rows = await unionAll(
        group(stateIs("PENDING"), true),
        group(stateIs("ASSIGNED", "RUNNING"), false),
      );
      return rows.map((r) => ({
        workload: r.workload,
        state: r.state,
        count: asNumber(r.count),
        oldestSeconds: r.oldestSeconds === null ? null : asNumber(r.oldestSeconds),
      }));
    },

    /**
     * What the PENDING tasks ask, summed per workload and resource. The
     * tasks are grouped by what they ask first, and each group's resources
     * read once, times its count (numeric: quantities go up to 10^15): at
     * 1,000,000 PENDING tasks in three groups, 0.7 s instead of 1.4-1.8 s
     * reading each task's.
     */
    async pendingResources(): Promise<Map<string, Resources>> {
      const rows = await rowsOf<{ workload: string; key: string; total: unknown }>(
        db,
        sql`select s.workload, e.key, sum(e.value::numeric * s.n) as total
          from (select t.workload, t.resources, count(*) as n from tasks t
            where t.state = 'PENDING' group by t.workload, t.resources) s,
          jsonb_each_text(s.resources) as e
          group by s.workload, e.key`,
      );
      const out = new Map<string, Resources>();
      for (const r of rows) {
        const map = out.get(r.workload) ?? {};
        map[r.key] = asNumber(r.total);
        out.set(r.workload, map);
      }
      return out;
    },

    /** PENDING backlog per workload: count and oldest creation, with the database's now. */
    async backlog(): Promise<{ workload: string; count: number; oldest: Date; now: Date }[]> {
      const rows = await db
        .select({
          workload: tasks.workload,
          count: sql<number>`count(*)::int`,
          oldest: sql`min(${tasks.createdAt})`.mapWith(tasks.createdAt),
          now: sql`now()`.mapWith(tasks.createdAt),
        })
        .from(tasks)
        .where(stateIs("PENDING"))
        .groupBy(tasks.workload)
        .orderBy(desc(sql`count(*)`), tasks.workload);
      return rows.map((r) => ({
        workload: r.workload,
        count: asNumber(r.count),
        oldest: r.oldest,
        now: r.now,
      }));
    },
  };
}
