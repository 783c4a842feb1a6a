import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Db } from "../../src/db/database.js";
import * as schema from "../../src/db/schema/index.js";
import { createTransitions } from "../../src/leases/transitions.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";

// The sweeper runs every second on every replica, so its statements must
// cost what they change, not the backlog: each finds its rows through a
// partial index and updates them by primary key. Checked, as the claim is
// (claim-plan.test.ts), on the plans PostgreSQL actually runs (auto_explain
// with row counts, no timings), over 100,000 PENDING tasks and a backlog of
// 20,000 overdue and 20,000 expired ones, before ANALYZE (this machine's
// PostgreSQL runs with autovacuum off) and after.
describe.skipIf(!onPostgres)("the sweeper's plans on PostgreSQL", () => {
  let tdb: TestDatabase;
  let client: postgres.Sql;
  let transitions: ReturnType<typeof createTransitions>;
  const plans: string[] = [];
  const columns = sql_columns();

  beforeAll(async () => {
    tdb = await createTestDatabase();
    client = postgres(tdb.url ?? "", {
      max: 1,
      onnotice: (n) => {
        if (typeof n.message === "string") plans.push(n.message);
      },
    });
    // 100,000 PENDING tasks, none due: 100 in backoff until later, 100 with
    // a deadline far ahead.
    await client.unsafe(`insert into tasks (${columns}, not_before, deadline)
      select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2,
        case when i % 1000 = 0 then now() + interval '1 hour' end,
        case when i % 1000 = 1 then now() + interval '1 day' end
      from generate_series(1, 100000) as i`);
    await client`load 'auto_explain'`;
    await client`set auto_explain.log_min_duration = 0`;
    await client`set auto_explain.log_analyze = on`;
    await client`set auto_explain.log_timing = off`;
    await client`set client_min_messages = log`;
    transitions = createTransitions(drizzle({ client, schema }) as unknown as Db);
  });
  afterAll(async () => {
    await client?.end();
    await tdb?.drop();
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

  for (const analyzed of [false, true]) {
    const when = analyzed ? "after" : "without";

    it(`finds a due retry through tasks_retry_idx ${when} ANALYZE`, async () => {
      await client.unsafe(`insert into tasks (${columns}, not_before)
        select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2,
          now() - interval '100 milliseconds' from generate_series(1, 5)`);
      if (analyzed) await client`analyze tasks`;
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
      await client.unsafe(`insert into tasks (${columns}, deadline)
        select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2,
          now() - interval '1 second' from generate_series(1, 20000)`);
      if (analyzed) await client`analyze tasks`;
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
      await client`delete from tasks where state = 'FAILED' or deadline <= now()`;
    });

    it(`expires 1,000 of 20,000 expired leases by primary key ${when} ANALYZE`, async () => {
      await client.unsafe(`insert into tasks (${columns}, attempt, lease_expires_at)
        select gen_random_uuid(), 'w', 'RUNNING', 3, 60, 1000, 300000, 2,
          1, now() - interval '1 second' from generate_series(1, 20000)`);
      if (analyzed) await client`analyze tasks`;
      let rows: unknown[] = [];
      const plan = await planOf(async () => {
        rows = await transitions.expire().execute({ limit: 1000 });
      });
      expect(rows).toHaveLength(1000);
      expect(plan).toMatch(/Update on tasks[\s\S]*Index Scan (using|on) tasks_pkey/);
      expect(plan).not.toContain("Hash Join");
      expect(pkeyRows(plan)).toBe(1000);
      expect(plan).not.toMatch(/Seq Scan on tasks/);
      await client`delete from tasks where lease_expires_at is not null`;
    });
  }
});

function sql_columns(): string {
  return "id, workload, state, max_attempts, lease_seconds, backoff_initial_ms, backoff_max_ms, backoff_multiplier";
}
