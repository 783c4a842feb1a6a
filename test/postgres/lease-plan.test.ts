import { drizzle } from "drizzle-orm/postgres-js";
import { beforeAll, describe, expect, it } from "vitest";
import type { Db } from "../../src/db/database.js";
import * as schema from "../../src/db/schema/index.js";
import { createTransitions } from "../../src/leases/transitions.js";
import { onPostgres } from "../support/database.js";
import { explainEverything, planDatabase } from "../support/plans.js";

// Every lease-bound request (complete, renew, ...) names its task: the
// statement must reach that row by primary key, never through the worker's
// leases. tasks_lease_worker_expiry_idx (worker, expiry) matches the lease
// check's `lease_worker_id = worker and lease_expires_at > now()` too, and
// on a table without statistics a completion of 32 was planned as a walk
// of the worker's live leases for each task: every lease the worker holds,
// and behind a transaction held open every lease it was granted in the
// last lease_seconds, 32 times (85 ms per CompleteTasks in the bench).
describe.skipIf(!onPostgres)("the lease-bound statements' plans on PostgreSQL", () => {
  let transitions: ReturnType<typeof createTransitions>;
  const plans: string[] = [];
  const pdb = planDatabase(plans);
  const worker = "a0000000-0000-4000-8000-00000000000a";
  let leased: string[] = [];

  beforeAll(async () => {
    const client = pdb.sql;
    await client`insert into workers (id, capabilities, max_concurrency) values (${worker}, '{w}', 10000)`;
    // 5,000 live leases of one worker.
    const rows = await client`insert into tasks (id, workload, state, attempt, max_attempts,
        lease_seconds, backoff_initial_ms, backoff_max_ms, backoff_multiplier,
        lease_worker_id, lease_token, lease_expires_at, started_at)
      select gen_random_uuid(), 'w', 'RUNNING', 1, 3, 60, 1000, 300000, 2,
        ${worker}, 't', now() + interval '10 minutes', now()
      from generate_series(1, 5000)
      returning id`;
    leased = rows.map((r) => r.id as string);
    // And a backlog of 50,000 PENDING tasks.
    await client`insert into tasks (id, workload, state, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier)
      select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2
      from generate_series(1, 50000)`;
    await explainEverything(client, { analyze: true, timing: false });
    transitions = createTransitions(drizzle({ client, schema }) as unknown as Db);
  });

  /** The next `n` leased tasks, each used once. */
  const next = (n: number) => leased.splice(0, n);

  /** The plan of the last of eight runs (the first five are custom plans, then a generic one may be kept). */
  async function planOf(run: () => Promise<unknown>): Promise<string> {
    for (let i = 0; i < 7; i++) await run();
    plans.length = 0;
    await run();
    return plans.join("\n");
  }

  /** The scans of tasks in `plan` and the rows each returned. */
  function scansOfTasks(plan: string): string[] {
    return [
      ...plan.matchAll(/(Index Scan|Seq Scan|Bitmap Index Scan)[^\n]* on (tasks\w*)[^\n]*/g),
    ].map((m) => m[0]);
  }

  for (const analyzed of [false, true]) {
    const when = analyzed ? "after" : "without";

    it(`completes 32 by primary key ${when} ANALYZE`, async () => {
      if (analyzed) await pdb.sql`analyze tasks`;
      const plan = await planOf(() =>
        transitions.complete().execute({
          items: JSON.stringify(
            next(32).map((id) => ({
              id,
              attempt: 1,
              worker_id: worker,
              token: "t",
              summary: "",
              metrics: {},
              hash: "h",
            })),
          ),
        }),
      );
      expect(plan).toMatch(/Update on tasks[\s\S]*Index Scan using tasks_pkey/);
      expect(scansOfTasks(plan).join("\n")).not.toMatch(/lease_worker|lease_expiry|Seq Scan/);
    });

    it(`renews a worker's leases by primary key ${when} ANALYZE`, async () => {
      const plan = await planOf(() =>
        transitions.renewMany().execute({
          worker,
          items: JSON.stringify(next(16).map((id) => ({ id, attempt: 1, token: "t" }))),
        }),
      );
      expect(plan).toMatch(/Update on tasks[\s\S]*Index Scan using tasks_pkey/);
      expect(scansOfTasks(plan).join("\n")).not.toMatch(/lease_worker|lease_expiry|Seq Scan/);
    });

    it(`renews one lease by primary key ${when} ANALYZE`, async () => {
      const plan = await planOf(() => {
        const [id] = next(1);
        return transitions.renew().execute({
          id,
          attempt: 1,
          worker,
          token: "t",
          extend: null,
          steps: null,
          message: null,
        });
      });
      expect(plan).toMatch(/Update on tasks[\s\S]*Index Scan using tasks_pkey/);
      expect(scansOfTasks(plan).join("\n")).not.toMatch(/lease_worker|lease_expiry|Seq Scan/);
    });
  }
});
