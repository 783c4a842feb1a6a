import { randomUUID } from "node:crypto";
import { eq, sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Database } from "../../src/db/database.js";
import { tasks, workers } from "../../src/db/schema/index.js";
import { createLeaseStore } from "../../src/leases/store.js";
import { createPlacementStore } from "../../src/tasks/placement.js";
import { createTaskStore } from "../../src/tasks/store.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { insertWorker, newTask } from "../support/fixtures.js";
import { uniqueWorkload } from "../support/harness.js";

// SKIP LOCKED races only mean something with real concurrent connections:
// PGlite is one connection and serialises every transaction.
describe.skipIf(!onPostgres)("PostgreSQL races", () => {
  let tdb: TestDatabase;
  let replica: Database;
  beforeAll(async () => {
    tdb = await createTestDatabase();
    replica = await tdb.reopen(); // a second coordinator's pool on the same database
  });
  afterAll(() => tdb.drop());

  it("8 concurrent claimers on two replicas drain 2,000 tasks: each claimed once, none lost", async () => {
    const workload = uniqueWorkload();
    const taskStore = createTaskStore(tdb.database.db);
    for (let i = 0; i < 2; i++) {
      await taskStore.create(Array.from({ length: 1000 }, () => newTask({ workload })));
    }
    const claimed: string[] = [];
    const claimers = Array.from({ length: 8 }, async (_, i) => {
      const leases = createLeaseStore((i % 2 === 0 ? tdb.database : replica).db);
      const workerId = `c0000000-0000-4000-8000-00000000000${i}`;
      await insertWorker(tdb.database.db, workerId);
      for (;;) {
        const rows = await leases.claim(
          { id: workerId, capabilities: [workload], labels: {} },
          1 + (i % 4) * 8,
        );
        if (rows.length === 0) return;
        for (const r of rows) claimed.push(`${r.id}#${r.attempt}`);
        const outcomes = await leases.complete(
          rows.map((r) => ({
            taskId: r.id,
            workerId,
            attempt: r.attempt,
            token: r.leaseToken ?? "",
            result: null,
            summary: "",
            metrics: {},
          })),
        );
        expect(outcomes.every((o) => "ok" in o)).toBe(true);
      }
    });
    await Promise.all(claimers);
    expect(claimed).toHaveLength(2000);
    expect(new Set(claimed).size).toBe(2000);
    const counts = await tdb.database.db
      .select({ state: tasks.state, n: sql<number>`count(*)::int` })
      .from(tasks)
      .where(sql`${tasks.workload} = ${workload}`)
      .groupBy(tasks.state);
    expect(counts).toEqual([{ state: "SUCCEEDED", n: 2000 }]);
  });

  it("a sweeper racing completions never overwrites an acknowledged completion", async () => {
    const workload = uniqueWorkload();
    const taskStore = createTaskStore(tdb.database.db);
    const leases = createLeaseStore(tdb.database.db);
    const sweeperLeases = createLeaseStore(replica.db);
    await taskStore.create(
      Array.from({ length: 400 }, () => newTask({ workload, maxAttempts: 1 })),
    );
    const workerId = "d0000000-0000-4000-8000-000000000001";
    await insertWorker(tdb.database.db, workerId);
    const rows = await leases
      .claim({ id: workerId, capabilities: [workload], labels: {} }, 100)
      .then(async (a) => [
        ...a,
        ...(await leases.claim({ id: workerId, capabilities: [workload], labels: {} }, 100)),
      ])
      .then(async (a) => [
        ...a,
        ...(await leases.claim({ id: workerId, capabilities: [workload], labels: {} }, 100)),
      ])
      .then(async (a) => [
        ...a,
        ...(await leases.claim({ id: workerId, capabilities: [workload], labels: {} }, 100)),
      ]);
    expect(rows).toHaveLength(400);
    // Every lease runs out at some moment in the next 500 ms, while completions arrive over the same 500 ms.
    await tdb.database.db.execute(
      sql`update tasks set lease_expires_at = now() + random() * interval '500 milliseconds' where workload = ${workload}`,
    );
    let sweeping = true;
    const sweeper = (async () => {
      while (sweeping) await sweeperLeases.expireLeases(50);
    })();
    const acknowledged: string[] = [];
    await Promise.all(
      rows.map(async (r, i) => {
        await new Promise((resolve) => setTimeout(resolve, i % 500));
        const [o] = await leases.complete([
          {
            taskId: r.id,
            workerId,
            attempt: r.attempt,
            token: "",
            result: null,
            summary: "",
            metrics: {},
          },
        ]);
        if (o && "ok" in o) acknowledged.push(r.id);
        else expect(o?.error.reason).toMatch(/LEASE_EXPIRED|NOT_LEASED/);
      }),
    );
    sweeping = false;
    await sweeper;
    await sweeperLeases.expireLeases(1000);
    const final = await tdb.database.db
      .select({ id: tasks.id, state: tasks.state })
      .from(tasks)
      .where(sql`${tasks.workload} = ${workload}`);
    const byId = new Map(final.map((r) => [r.id, r.state]));
    // The race is real: some completions won, some leases ran out first.
    expect(acknowledged.length).toBeGreaterThan(0);
    expect(acknowledged.length).toBeLessThan(400);
    for (const id of acknowledged) expect(byId.get(id)).toBe("SUCCEEDED");
    const succeeded = final.filter((r) => r.state === "SUCCEEDED").length;
    expect(succeeded).toBe(acknowledged.length);
    expect(final.filter((r) => r.state === "FAILED").length).toBe(400 - acknowledged.length);
  });

  it("20 concurrent ScheduleTask calls on one task place it exactly once", async () => {
    const workload = uniqueWorkload();
    const placement = createPlacementStore(tdb.database.db, 15);
    const other = createPlacementStore(replica.db, 15);
    for (let i = 0; i < 3; i++) {
      await tdb.database.db.insert(workers).values({
        id: randomUUID(),
        name: `p${i}`,
        capabilities: [workload],
        apiBaseUrl: `http://p${i}.example/`,
        maxConcurrency: 5,
      });
    }
    const [task] = await createTaskStore(tdb.database.db).create([newTask({ workload })]);
    const outcomes = await Promise.allSettled(
      Array.from({ length: 20 }, (_, i) =>
        (i % 2 ? other : placement).schedule({
          taskId: task?.id ?? "",
          key: `key-${i}`,
          correlationId: "",
          leaseSeconds: 600,
        }),
      ),
    );
    const placed = outcomes.filter((o) => o.status === "fulfilled");
    expect(placed).toHaveLength(1);
    for (const o of outcomes) {
      if (o.status === "rejected")
        expect(o.reason).toMatchObject({ kind: "aborted", reason: "ALREADY_ASSIGNED" });
    }
    const [row] = await tdb.database.db
      .select()
      .from(tasks)
      .where(eq(tasks.id, task?.id ?? ""));
    expect(row).toMatchObject({ state: "ASSIGNED", attempt: 1 });
  });

  it("concurrent placements of different tasks never overfill a worker's slots", async () => {
    const workload = uniqueWorkload();
    const placement = createPlacementStore(tdb.database.db, 15);
    const other = createPlacementStore(replica.db, 15);
    const workerId = randomUUID();
    await tdb.database.db.insert(workers).values({
      id: workerId,
      name: "one-slot",
      capabilities: [workload],
      apiBaseUrl: "http://one-slot.example/",
      maxConcurrency: 1,
    });
    const created = await createTaskStore(tdb.database.db).create(
      Array.from({ length: 10 }, () => newTask({ workload })),
    );
    const outcomes = await Promise.allSettled(
      created.map((t, i) =>
        (i % 2 ? other : placement).schedule({
          taskId: t.id,
          key: "",
          correlationId: "",
          leaseSeconds: 600,
        }),
      ),
    );
    expect(outcomes.filter((o) => o.status === "fulfilled")).toHaveLength(1);
    for (const o of outcomes) {
      if (o.status === "rejected") {
        expect(o.reason).toMatchObject({ kind: "failed_precondition", reason: "NO_CANDIDATE" });
      }
    }
    const held = await tdb.database.db
      .select({ id: tasks.id })
      .from(tasks)
      .where(eq(tasks.leaseWorkerId, workerId));
    expect(held).toHaveLength(1);
  });

  it("concurrent claims by one worker never take more than its max_concurrency", async () => {
    const workload = uniqueWorkload();
    const workerId = randomUUID();
    await insertWorker(tdb.database.db, workerId, false, 2);
    await createTaskStore(tdb.database.db).create(
      Array.from({ length: 20 }, () => newTask({ workload })),
    );
    const stores = [createLeaseStore(tdb.database.db), createLeaseStore(replica.db)];
    const claimed = await Promise.all(
      Array.from({ length: 16 }, (_, i) =>
        (stores[i % 2] ?? stores[0])?.claim(
          { id: workerId, capabilities: [workload], labels: {} },
          2,
        ),
      ),
    );
    expect(claimed.flat()).toHaveLength(2);
  });

  it("a worker's lock held long holds up only that worker's claim, not the others made with it", async () => {
    const workload = uniqueWorkload();
    const held = `d0000000-0000-4000-8000-0000000000${randomUUID().slice(0, 2)}`;
    const free = `e0000000-0000-4000-8000-0000000000${randomUUID().slice(0, 2)}`;
    await insertWorker(tdb.database.db, held);
    await insertWorker(tdb.database.db, free);
    await createTaskStore(tdb.database.db).create([newTask({ workload }), newTask({ workload })]);
    const leases = createLeaseStore(tdb.database.db);
    // Another transaction (a placement, say) holds `held`'s row until told.
    let release: () => void = () => {};
    const released = new Promise<void>((r) => {
      release = r;
    });
    let locked: () => void = () => {};
    const isLocked = new Promise<void>((r) => {
      locked = r;
    });
    const holder = replica.db.transaction(async (tx) => {
      await tx.execute(sql`select 1 from workers where id = ${held} for update`);
      locked();
      await released;
    });
    await isLocked;
    try {
      // The first claim runs alone; the two made meanwhile share a statement.
      const first = leases.claimCounted({ id: free, capabilities: ["none"], labels: {} }, 1);
      const blocked = leases.claimCounted({ id: held, capabilities: [workload], labels: {} }, 1);
      const other = leases.claimCounted({ id: free, capabilities: [workload], labels: {} }, 1);
      await first;
      // Answered while the lock is still held (without lock_timeout, the
      // batch waited for it, and this test with it, until released).
      expect((await other).rows).toHaveLength(1);
      await expect(blocked).rejects.toMatchObject({ cause: { code: "55P03" } });
    } finally {
      release();
      await holder;
    }
  }, 30_000);
});
