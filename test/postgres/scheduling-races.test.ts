import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Database } from "../../src/db/database.js";
import { workers } from "../../src/db/schema/index.js";
import { rowsOf } from "../../src/db/values.js";
import { createLeaseStore, type LeaseStore } from "../../src/leases/store.js";
import { createSchedulingStore } from "../../src/scheduling/store.js";
import { createPlacementStore } from "../../src/tasks/placement.js";
import { createTaskStore } from "../../src/tasks/store.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { newTask } from "../support/fixtures.js";
import { uniqueWorkload } from "../support/harness.js";

// Resources and limits are decided in the statement that grants the lease,
// under the worker's and the key's row locks: claims racing on two
// replicas (two connection pools) never over-commit a worker nor pass a
// limit. Each claimer claims and holds: nothing ends, so a total above the
// capacity or the limit would stay visible at the end.
describe.skipIf(!onPostgres)("scheduling races on PostgreSQL", () => {
  let tdb: TestDatabase;
  let replica: Database;
  beforeAll(async () => {
    tdb = await createTestDatabase();
    replica = await tdb.reopen();
  });
  afterAll(() => tdb.drop());

  const storeOn = (i: number): LeaseStore =>
    createLeaseStore((i % 2 === 0 ? tdb.database : replica).db);

  async function gpuWorker(id: string, gpus: number): Promise<void> {
    await tdb.database.db
      .insert(workers)
      .values({ id, name: "gpu", maxConcurrency: 1000, capacity: { gpu: gpus, memory: 64 } });
  }

  it("12 claimers of one 8-GPU worker, on two replicas, pack at most its capacity", async () => {
    const workload = uniqueWorkload();
    const tasks = createTaskStore(tdb.database.db);
    await tasks.create(
      Array.from({ length: 60 }, (_, i) =>
        newTask({ workload, resources: { slots: 1, gpu: 1 + (i % 3), memory: 4 + (i % 5) } }),
      ),
    );
    const workerId = "e0000000-0000-4000-8000-000000000001";
    await gpuWorker(workerId, 8);
    const got = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        storeOn(i).claim({ id: workerId, capabilities: [workload], labels: {} }, 1 + (i % 4)),
      ),
    );
    const [held] = await rowsOf<{ gpu: number; memory: number; n: number }>(
      tdb.database.db,
      sql`select coalesce(sum((resources->>'gpu')::int), 0)::int as gpu,
          coalesce(sum((resources->>'memory')::int), 0)::int as memory, count(*)::int as n
        from tasks where workload = ${workload} and state = 'RUNNING'`,
    );
    expect(held?.gpu).toBeLessThanOrEqual(8);
    expect(held?.memory).toBeLessThanOrEqual(64);
    expect(held?.n).toBe(got.flat().length);
    // Packed: no waiting task that fits what is left (the smallest asks 1 GPU).
    expect(held?.gpu).toBeGreaterThanOrEqual(7);
  });

  it("a concurrency limit and a rate hold across two replicas' claims and placements", async () => {
    const workload = uniqueWorkload();
    const key = `lic-${workload}`;
    const rateKey = `api-${workload}`;
    const scheduling = createSchedulingStore(tdb.database.db, 15);
    await scheduling.setLimit(key, 3);
    await scheduling.setRate(rateKey, 0.001, 5);
    const tasks = createTaskStore(tdb.database.db);
    await tasks.create(
      Array.from({ length: 40 }, () => newTask({ workload, concurrencyKey: key })),
    );
    const rated = await tasks.create(
      Array.from({ length: 40 }, () => newTask({ workload, rateKey })),
    );
    const ids = Array.from(
      { length: 10 },
      (_, i) => `f0000000-0000-4000-8000-0000000000${String(10 + i)}`,
    );
    for (const id of ids) await gpuWorker(id, 1);
    await tdb.database.db.execute(
      sql`update workers set capabilities = ${`{${workload}}`}::text[], api_base_url = 'http://w.example/' where id = any(${`{${ids.join(",")}}`}::uuid[])`,
    );
    const placement = [
      createPlacementStore(tdb.database.db, 15),
      createPlacementStore(replica.db, 15),
    ];
    await Promise.all([
      ...ids.map((id, i) => storeOn(i).claim({ id, capabilities: [workload], labels: {} }, 10)),
      // Placements of rate-limited tasks race the claims for the tokens.
      ...rated
        .slice(0, 10)
        .map((t, i) =>
          (placement[i % 2] as ReturnType<typeof createPlacementStore>)
            .schedule({ taskId: t.id, key: "", correlationId: "", leaseSeconds: 600 })
            .catch(() => undefined),
        ),
    ]);
    const [counts] = await rowsOf<{ keyed: number; rated: number }>(
      tdb.database.db,
      sql`select count(*) filter (where concurrency_key = ${key})::int as keyed,
          count(*) filter (where rate_key = ${rateKey})::int as rated
        from tasks where workload = ${workload} and state in ('ASSIGNED', 'RUNNING')`,
    );
    expect(counts).toEqual({ keyed: 3, rated: 5 });
  });
});
