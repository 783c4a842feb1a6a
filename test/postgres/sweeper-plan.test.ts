import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import { beforeAll, describe, expect, it } from "vitest";
import type { Db } from "../../src/db/database.js";
import * as schema from "../../src/db/schema/index.js";
import { rowsOf } from "../../src/db/values.js";
import { createTransitions } from "../../src/leases/transitions.js";
import { createRetention } from "../../src/tasks/retention.js";
import { onPostgres } from "../support/database.js";
import { explainEverything, planDatabase } from "../support/plans.js";

// The sweeper runs every second on every replica, and retention every
// minute, so their statements must cost what they change, not the backlog:
// each finds its rows through a partial index and changes them by primary
// key. Checked, as the claim is (claim-plan.test.ts), on the plans
// PostgreSQL actually runs (auto_explain with row counts, no timings), over
// 100,000 PENDING tasks and a backlog of 20,000 due ones, before ANALYZE
// (this machine's PostgreSQL runs with autovacuum off) and after.
describe.skipIf(!onPostgres)("the sweeper's plans on PostgreSQL", () => {
  let transitions: ReturnType<typeof createTransitions>;
  let db: Db;
  const plans: string[] = [];
  const pdb = planDatabase(plans);
  const columns = sql_columns();

  beforeAll(async () => {
    const client = pdb.sql;
    // 100,000 PENDING tasks, none due: 100 in backoff until later, 100 with
    // a deadline far ahead.
    await client.unsafe(`insert into tasks (${columns}, not_before, deadline)
      select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2,
        case when i % 1000 = 0 then now() + interval '1 hour' end,
        case when i % 1000 = 1 then now() + interval '1 day' end
      from generate_series(1, 100000) as i`);
    await explainEverything(client, { analyze: true, timing: false });
    db = drizzle({ client, schema }) as unknown as Db;
    transitions = createTransitions(db);
  });

  /** The plan of the one statement run, with the actual row counts. */
  async function planOf(run: () => Promise<unknown>): Promise<string> {
    plans.length = 0;
    await run();
    return plans.join("\n");
  }

  /** The rows the primary-key scan that feeds the UPDATE returned. */
  function pkeyRows(plan: string): number {
    const m = /Index Scan (?:using|on) tasks_pkey[^\n]*actual rows=(\d+)/.exec(plan);
    return Number(m?.[1] ?? -1);
  }

  // PostgreSQL compiles a statement whose estimated cost passes
  // jit_above_cost: retention's delete, steered onto indexes (up to
  // PostgreSQL 17 a disabled scan is costed at 10^10), took 0.9 s of a
  // core on every run for that alone. The coordinator's own connections
  // never compile, whatever the cost; a plain one, as a control, does
  // (where the server has a JIT provider).
  it("compiles no statement on the coordinator's connections (JIT off)", async () => {
    const compiled = async (handle: Db) =>
      handle.transaction(async (tx) => {
        await tx.execute(sql`set local jit_above_cost = 0`);
        const lines = await rowsOf<{ "QUERY PLAN": string }>(
          tx,
          sql`explain select count(*) from tasks where workload = 'w'`,
        );
        const [jit] = await rowsOf<{ setting: string; available: boolean }>(
          tx,
          sql`select current_setting('jit') as setting, pg_jit_available() as available`,
        );
        return { plan: lines.map((l) => l["QUERY PLAN"]).join("\n"), ...jit };
      });
    const { database } = pdb.tdb;
    for (const handle of [database.db, database.urgent, database.housekeeping, database.upkeep]) {
      const { plan, setting, available } = await compiled(handle);
      expect(setting).toBe("off");
      expect(available).toBe(false);
      expect(plan).not.toContain("JIT:");
    }
    const control = await compiled(db);
    if (control.available) expect(control.plan).toContain("JIT:");
  });

  for (const analyzed of [false, true]) {
    const when = analyzed ? "after" : "without";

    it(`finds a due retry through tasks_retry_idx ${when} ANALYZE`, async () => {
      await pdb.sql.unsafe(`insert into tasks (${columns}, not_before)
        select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2,
          now() - interval '100 milliseconds' from generate_series(1, 5)`);
      if (analyzed) await pdb.sql`analyze tasks`;
      let rows: unknown[] = [];
      const plan = await planOf(async () => {
        rows = await transitions.retryDue().execute({ ms: 2000 });
      });
      expect(rows).toHaveLength(1);
      expect(plan).toContain("Index Scan using tasks_retry_idx");
      expect(plan).not.toMatch(/Seq Scan on tasks|Bitmap/);
      expect(plan).toMatch(/Index Scan using tasks_retry_idx[^\n]*actual rows=1 /);
    });

    it(`fails 1,000 of 20,000 overdue tasks by primary key ${when} ANALYZE`, async () => {
      await pdb.sql.unsafe(`insert into tasks (${columns}, deadline)
        select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2,
          now() - interval '1 second' from generate_series(1, 20000)`);
      if (analyzed) await pdb.sql`analyze tasks`;
      let rows: unknown[] = [];
      const plan = await planOf(async () => {
        rows = await transitions.failPastDeadline().execute({ limit: 1000 });
      });
      expect(rows).toHaveLength(1000);
      expect(plan).toMatch(/Update on tasks[\s\S]*Index Scan (using|on) tasks_pkey/);
      expect(plan).not.toContain("Hash Join");
      // The UPDATE reads the 1,000 picked rows, not the backlog. (Without
      // statistics the pick itself may read the backlog's entries of
      // tasks_deadline_idx as a bitmap: bounded by the overdue rows, never
      // every PENDING one.)
      expect(pkeyRows(plan)).toBe(1000);
      expect(plan).not.toMatch(/Seq Scan on tasks/);
      await pdb.sql`delete from tasks where state = 'FAILED' or deadline <= now()`;
    });

    it(`expires 1,000 of 20,000 expired leases by primary key ${when} ANALYZE`, async () => {
      await pdb.sql.unsafe(`insert into tasks (${columns}, attempt, lease_expires_at)
        select gen_random_uuid(), 'w', 'RUNNING', 3, 60, 1000, 300000, 2,
          1, now() - interval '1 second' from generate_series(1, 20000)`);
      if (analyzed) await pdb.sql`analyze tasks`;
      let rows: unknown[] = [];
      const plan = await planOf(async () => {
        rows = await transitions.expire().execute({ limit: 1000, from: null });
      });
      expect(rows).toHaveLength(1000);
      expect(plan).toMatch(/Update on tasks[\s\S]*Index Scan (using|on) tasks_pkey/);
      expect(plan).not.toContain("Hash Join");
      expect(pkeyRows(plan)).toBe(1000);
      expect(plan).not.toMatch(/Seq Scan on tasks/);
      await pdb.sql`delete from tasks where lease_expires_at is not null`;
    });

    it(`expires from the sweeper's mark without reading the leases that expired before it ${when} ANALYZE`, async () => {
      // 20,000 that expired an hour ago (a whole pass's), 500 a second ago.
      await pdb.sql.unsafe(`insert into tasks (${columns}, attempt, lease_expires_at)
        select gen_random_uuid(), 'w', 'RUNNING', 3, 60, 1000, 300000, 2, 1,
          now() - case when i <= 500 then interval '1 second' else interval '1 hour' end
        from generate_series(1, 20500) as i`);
      if (analyzed) await pdb.sql`analyze tasks`;
      const [mark] = await pdb.sql`select now() - interval '5 seconds' as t`;
      let rows: unknown[] = [];
      const plan = await planOf(async () => {
        rows = await transitions.expire().execute({ limit: 1000, from: mark?.t });
      });
      expect(rows).toHaveLength(500);
      const expiry = /Index Scan (?:using|on) tasks_lease_expiry_idx[^\n]*actual rows=(\d+)/.exec(
        plan,
      );
      expect(Number(expiry?.[1] ?? -1)).toBe(500);
      expect(plan).not.toMatch(/Seq Scan on tasks/);
      await pdb.sql`delete from tasks where lease_expires_at is not null`;
    });

    it(`deletes 500 of 20,000 old finished tasks by primary key ${when} ANALYZE`, async () => {
      // 20,000 finished long ago, 20,000 recently, one in ten with an output
      // artifact and one in ten naming an input.
      await pdb.sql.unsafe(`insert into tasks (${columns}, finished_at, input)
        select gen_random_uuid(), 'w', 'SUCCEEDED', 3, 60, 1000, 300000, 2,
          now() - case when i % 2 = 0 then interval '8 days' else interval '1 day' end,
          case when i % 10 = 1 then jsonb_build_object('artifactId', gen_random_uuid()) end
        from generate_series(1, 40000) as i`);
      await pdb.sql.unsafe(`insert into artifacts (id, task_id, filename, kind, sha256, size_bytes)
        select gen_random_uuid(), id, 'out', 'OUTPUT', md5(id::text), 1
        from tasks where state = 'SUCCEEDED' and random() < 0.1`);
      await pdb.sql.unsafe(`insert into artifacts (id, task_id, filename, kind, sha256, size_bytes)
        select (input->>'artifactId')::uuid, null, 'in', 'INPUT', md5(id::text), 1
        from tasks where state = 'SUCCEEDED' and input is not null`);
      if (analyzed) await pdb.sql`analyze`;
      const retention = createRetention(
        { db, blobs: {}, log: { info() {}, debug() {}, warn() {}, error() {} } },
        { retentionMs: 7 * 86_400_000, maxBatches: 1 },
      );
      const plan = await planOf(async () => {
        expect(await retention.runOnce()).toMatchObject({ tasks: 500 });
      });
      const del = plans.find((p) => p.includes("doomed")) ?? "";
      expect(del).toContain("tasks_finished_idx");
      expect(del).toMatch(/Delete on tasks[\s\S]*Index Scan (using|on) tasks_pkey/);
      expect(del).toMatch(/Delete on artifacts a_1[\s\S]*Index Scan (using|on) artifacts_pkey/);
      expect(del).not.toMatch(/Seq Scan on (tasks|artifacts)/);
      expect(del).not.toContain("Index Cond: (task_id IS NULL)");
      expect(plan).not.toContain("Hash Join");
      await pdb.sql`delete from tasks where state = 'SUCCEEDED'`;
      await pdb.sql`delete from artifacts`;
    });

    it(`reads no finished task it keeps: 100,000 finished recently, none old, ${when} ANALYZE`, async () => {
      await pdb.sql.unsafe(`insert into tasks (${columns}, finished_at)
        select gen_random_uuid(), 'w', 'SUCCEEDED', 3, 60, 1000, 300000, 2,
          now() - interval '1 hour' + i * interval '1 millisecond'
        from generate_series(1, 100000) as i`);
      if (analyzed) await pdb.sql`analyze`;
      const retention = createRetention(
        { db, blobs: {}, log: { info() {}, debug() {}, warn() {}, error() {} } },
        { retentionMs: 7 * 86_400_000, maxBatches: 1 },
      );
      await planOf(async () => {
        expect(await retention.runOnce()).toMatchObject({ tasks: 0 });
      });
      const del = plans.find((p) => p.includes("doomed")) ?? "";
      expect(del).toContain("tasks_finished_idx");
      expect(del).not.toMatch(/Merge (Anti )?Join/);
      // No node of the plan returned more than a handful of rows (a merge
      // anti-join over tasks_pkey returned every finished task).
      const counts = [...del.matchAll(/actual rows=(\d+)/g)].map((m) => Number(m[1]));
      expect(counts.length).toBeGreaterThan(0);
      expect(Math.max(...counts), del).toBeLessThan(1000);
      await pdb.sql`delete from tasks where state = 'SUCCEEDED'`;
    });
  }
});

function sql_columns(): string {
  return "id, workload, state, max_attempts, lease_seconds, backoff_initial_ms, backoff_max_ms, backoff_multiplier";
}
