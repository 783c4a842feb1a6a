import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WorkerState } from "../../gen/meshwork/v1/fleet_pb.js";
import { outcome } from "../support/errors.js";
import { claimOne, createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(() => h.close());

/** Makes a worker look as if its last heartbeat were `seconds` ago. */
const silentFor = (workerId: string, seconds: number) =>
  h.app.database.db.execute(
    sql`update workers set last_heartbeat_at = now() - make_interval(secs => ${seconds}) where id = ${workerId}::uuid`,
  );

const register = async (name: string, capabilities: string[]) =>
  (await h.fleet.registerWorker({ name, capabilities })).workerId;

describe("a worker without a peer id that restarts", () => {
  it("takes its LOST row again (same name and workloads), never a live one's or another's", async () => {
    const workload = uniqueWorkload("rows");
    const first = await register("render-box-1", [workload]);
    // Alive: a second process under the same name is another worker.
    const twin = await register("render-box-1", [workload]);
    expect(twin).not.toBe(first);
    await silentFor(first, 3600);
    await silentFor(twin, 3600);
    const again = await register("render-box-1", [workload]);
    expect([first, twin]).toContain(again);
    const { worker } = await h.fleet.getWorker({ workerId: again });
    expect(worker?.state).toBe(WorkerState.ACTIVE);
    // Other workloads or another name: a new row.
    const other = await register("render-box-1", [workload, "extra"]);
    expect([first, twin]).not.toContain(other);
    const renamed = await register("render-box-2", [workload]);
    expect([first, twin]).not.toContain(renamed);
  });
});

describe("PruneWorkers", () => {
  it("removes workers LOST for long enough without live leases; counts them with dry_run", async () => {
    const workload = uniqueWorkload("prune");
    const gone = await register("gone", [workload]);
    const holding = await register("holding", [workload]);
    const alive = await register("alive", [workload]);
    await h.tasks.createTask({ workload, leaseSeconds: 3600 });
    await claimOne(h, holding);
    await silentFor(gone, 7200);
    await silentFor(holding, 7200);
    const lostFor = { seconds: 3600n, nanos: 0 };
    const dry = await h.fleet.pruneWorkers({ lostFor, dryRun: true });
    expect(dry.count).toBeGreaterThanOrEqual(1);
    expect((await h.fleet.getWorker({ workerId: gone })).worker?.workerId).toBe(gone);
    const done = await h.fleet.pruneWorkers({ lostFor });
    expect(done.count).toBe(dry.count);
    expect(await outcome(h.fleet.getWorker({ workerId: gone }))).toMatchObject({
      code: "NotFound",
    });
    // A worker whose lease is live, and a live one, stay.
    expect((await h.fleet.getWorker({ workerId: holding })).worker?.workerId).toBe(holding);
    expect((await h.fleet.getWorker({ workerId: alive })).worker?.workerId).toBe(alive);
    const bad = await outcome(h.fleet.pruneWorkers({ lostFor: { seconds: 0n, nanos: 5 } }));
    expect(bad).toMatchObject({ code: "InvalidArgument" });
  });
});
