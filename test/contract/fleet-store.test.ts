import { eq, sql } from "drizzle-orm";
import { beforeAll, describe, expect, it } from "vitest";
import { workers } from "../../src/db/schema/index.js";
import { createFleetStore, type FleetStore, type WorkerInput } from "../../src/fleet/store.js";
import { createLeaseStore } from "../../src/leases/store.js";
import { createTaskStore } from "../../src/tasks/store.js";
import { describeEachEngine } from "../support/engines.js";
import { newTask } from "../support/fixtures.js";
import { uniqueWorkload } from "../support/harness.js";

describeEachEngine("fleet store", (db) => {
  /** The database of the engine being run (set before the first test). */
  const tdb = {
    get database() {
      return db();
    },
  };
  let fleet: FleetStore;

  beforeAll(async () => {
    fleet = createFleetStore(tdb.database.db, 15);
  });

  function input(overrides: Partial<WorkerInput> = {}): WorkerInput {
    return {
      name: "w",
      capabilities: ["echo"],
      labels: {},
      cpuCount: 8,
      memoryMb: 16384,
      apiBaseUrl: "",
      maxConcurrency: undefined,
      ...overrides,
    };
  }

  describe("fleet store", () => {
    it("registers a worker ACTIVE with max_concurrency 1, and updates it in place", async () => {
      const w = await fleet.register(input({ name: "lab-01" }));
      expect(w).toMatchObject({
        name: "lab-01",
        maxConcurrency: 1,
        lost: false,
        drained: false,
        activeLeases: 0,
      });
      const updated = await fleet.register(
        input({ name: "lab-01b", capabilities: ["a", "b"], maxConcurrency: 4 }),
        w.id,
      );
      expect(updated).toMatchObject({
        id: w.id,
        name: "lab-01b",
        capabilities: ["a", "b"],
        maxConcurrency: 4,
      });
      expect(updated.registeredAt).toEqual(w.registeredAt);
    });

    it("answers not_found when updating an unknown worker", async () => {
      await expect(
        fleet.register(input(), "00000000-0000-4000-8000-000000000000"),
      ).rejects.toMatchObject({
        kind: "not_found",
      });
    });

    it("marks a worker LOST after three missed heartbeat intervals, ACTIVE again on a heartbeat", async () => {
      const w = await fleet.register(input());
      await tdb.database.db
        .update(workers)
        .set({ lastHeartbeatAt: sql`now() - interval '46 seconds'` })
        .where(eq(workers.id, w.id));
      expect((await fleet.get(w.id)).lost).toBe(true);
      await fleet.heartbeat(w.id, 7);
      expect(await fleet.get(w.id)).toMatchObject({ lost: false, queueDepth: 7 });
    });

    it("filters by capability, labels, drained and state, paging in registration order", async () => {
      const cap = uniqueWorkload("cap");
      const a = await fleet.register(
        input({ name: "a", capabilities: [cap], labels: { zone: "a" } }),
      );
      const b = await fleet.register(
        input({ name: "b", capabilities: [cap], labels: { zone: "b" } }),
      );
      const c = await fleet.register(
        input({ name: "c", capabilities: [cap], labels: { zone: "a" } }),
      );
      await fleet.drain(c.id, true);
      const first = await fleet.list({ capability: cap }, 2, undefined);
      expect(first.rows.map((r) => r.name)).toEqual(["a", "b"]);
      expect(first.next).not.toBe("");
      const zoneA = await fleet.list({ capability: cap, labels: { zone: "a" } }, 10, undefined);
      expect(zoneA.rows.map((r) => r.id)).toEqual([a.id, c.id]);
      const drained = await fleet.list({ capability: cap, drained: true }, 10, undefined);
      expect(drained.rows.map((r) => r.id)).toEqual([c.id]);
      const active = await fleet.list(
        { capability: cap, lost: false, drained: false },
        10,
        undefined,
      );
      expect(active.rows.map((r) => r.id)).toEqual([a.id, b.id]);
    });

    it("counts a worker's live leases", async () => {
      const workload = uniqueWorkload();
      const w = await fleet.register(input({ capabilities: [workload], maxConcurrency: 5 }));
      await createTaskStore(tdb.database.db).create([newTask({ workload }), newTask({ workload })]);
      await createLeaseStore(tdb.database.db).claim(
        { id: w.id, capabilities: [workload], labels: {} },
        2,
      );
      expect((await fleet.get(w.id)).activeLeases).toBe(2);
    });

    it("writes buffered heartbeats of many workers at once", async () => {
      const a = await fleet.register(input());
      const b = await fleet.register(input());
      await tdb.database.db
        .update(workers)
        .set({ lastHeartbeatAt: sql`now() - interval '1 hour'` });
      await fleet.heartbeatMany(
        new Map([
          [a.id, 3],
          [b.id, undefined],
        ]),
      );
      expect(await fleet.get(a.id)).toMatchObject({ lost: false, queueDepth: 3 });
      expect(await fleet.get(b.id)).toMatchObject({ lost: false, queueDepth: 0 });
    });

    it("removes a worker", async () => {
      const w = await fleet.register(input());
      await fleet.remove(w.id);
      await expect(fleet.get(w.id)).rejects.toMatchObject({ kind: "not_found" });
      await expect(fleet.remove(w.id)).rejects.toMatchObject({ kind: "not_found" });
    });
  });
});
