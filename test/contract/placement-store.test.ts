import { eq, sql } from "drizzle-orm";
import { beforeAll, expect, it } from "vitest";
import { workers } from "../../src/db/schema/index.js";
import { createFleetStore, type FleetStore, type WorkerInput } from "../../src/fleet/store.js";
import { createPlacementStore, type PlacementStore } from "../../src/tasks/placement.js";
import { createTaskStore, type TaskStore } from "../../src/tasks/store.js";
import { describeEachEngine } from "../support/engines.js";
import { expireLease, newTask } from "../support/fixtures.js";
import { uniqueWorkload } from "../support/harness.js";

describeEachEngine("placement store", (db) => {
  let fleet: FleetStore;
  let tasks: TaskStore;
  let placement: PlacementStore;
  beforeAll(() => {
    fleet = createFleetStore(db().db, 15);
    tasks = createTaskStore(db().db);
    placement = createPlacementStore(db().db, 15);
  });

  async function worker(name: string, overrides: Partial<WorkerInput> = {}): Promise<string> {
    const w = await fleet.register({
      name,
      capabilities: [],
      labels: {},
      cpuCount: 1,
      memoryMb: 1024,
      apiBaseUrl: `http://${name}.example:8080/`,
      maxConcurrency: 1,
      ...overrides,
    });
    return w.id;
  }

  async function task(workload: string, overrides: Parameters<typeof newTask>[0] = {}) {
    const [row] = await tasks.create([newTask({ workload, ...overrides })]);
    if (!row) throw new Error("no task");
    return row.id;
  }

  const place = (taskId: string, key = "") =>
    placement.schedule({ taskId, key, correlationId: "", leaseSeconds: 600 });

  it("assigns a fitting worker with a lease, its api_base_url and a new attempt", async () => {
    const w = uniqueWorkload();
    const id = await worker(`fit-${w}`, { capabilities: [w] });
    const placed = await place(await task(w));
    expect(placed).toMatchObject({
      state: "ASSIGNED",
      attempt: 1,
      assignedWorkerId: id,
      leaseWorkerId: id,
      assignedApiBaseUrl: `http://fit-${w}.example:8080/`,
    });
    expect(placed.leaseToken).toMatch(/^[0-9a-f]{64}$/);
  });

  it("refuses every worker that breaks one rule, naming the rule", async () => {
    const w = uniqueWorkload();
    const taskId = await task(w, { requiredCapabilities: ["gpu"], affinity: { zone: "a" } });
    const fits = { capabilities: [w, "gpu"], labels: { zone: "a" } };
    await fleet.drain(await worker(`drained-${w}`, fits), true);
    const lost = await worker(`lost-${w}`, fits);
    await db()
      .db.update(workers)
      .set({ lastHeartbeatAt: sql`now() - interval '1 hour'` })
      .where(eq(workers.id, lost));
    await worker(`nourl-${w}`, { ...fits, apiBaseUrl: "" });
    await worker(`zone-${w}`, { ...fits, labels: { zone: "b" } });
    await worker(`nogpu-${w}`, { ...fits, capabilities: [w] });
    const full = await worker(`full-${w}`, fits);
    const other = await task(w, { requiredCapabilities: ["gpu"], affinity: { zone: "a" } });
    await place(other); // takes full's only slot
    const refusal = await place(taskId).then(
      () => undefined,
      (e: { kind: string; reason: string; message: string }) => e,
    );
    expect(refusal).toMatchObject({ kind: "failed_precondition", reason: "NO_CANDIDATE" });
    for (const why of [
      `drained-${w}: drained`,
      `lost-${w}: lost`,
      `nourl-${w}: no api_base_url`,
      `zone-${w}: label zone is not a`,
      `nogpu-${w}: missing capability gpu`,
      `full-${w}: no free slot (1/1)`,
    ]) {
      expect(refusal?.message).toContain(why);
    }
    expect((await tasks.get(taskId)).state).toBe("PENDING");
    expect((await tasks.get(other)).assignedWorkerId).toBe(full);
  });

  it("counts a brick:<id> label value as capability <id>", async () => {
    const w = uniqueWorkload();
    const id = await worker(`brick-${w}`, { labels: { slot0: `brick:${w}` } });
    expect((await place(await task(w))).assignedWorkerId).toBe(id);
  });

  it("prefers most free slots, then lowest queue depth, then latest heartbeat", async () => {
    const w = uniqueWorkload();
    const roomy = await worker(`roomy-${w}`, { capabilities: [w], maxConcurrency: 3 });
    const busy = await worker(`busy-${w}`, { capabilities: [w], maxConcurrency: 2 });
    expect((await place(await task(w))).assignedWorkerId).toBe(roomy); // 3 free vs 2
    await fleet.heartbeat(roomy, 5);
    await fleet.heartbeat(busy, 1);
    expect((await place(await task(w))).assignedWorkerId).toBe(busy); // 2 vs 2: depth 1 < 5
    await fleet.heartbeat(roomy, 1);
    // Two heartbeats can land in the same millisecond: busy's is moved back.
    await db()
      .db.update(workers)
      .set({ lastHeartbeatAt: sql`now() - interval '1 second'` })
      .where(eq(workers.id, busy));
    // 1 free each, depth 1 each: the latest heartbeat (roomy's) wins.
    expect((await place(await task(w))).assignedWorkerId).toBe(roomy);
  });

  it("returns the same assignment for the same key and refuses another key with the task", async () => {
    const w = uniqueWorkload();
    await worker(`a-${w}`, { capabilities: [w] });
    await worker(`b-${w}`, { capabilities: [w] });
    const taskId = await task(w);
    const first = await place(taskId, "k1");
    expect(await place(taskId, "k1")).toEqual(first);
    await expect(place(taskId, "k2")).rejects.toMatchObject({
      kind: "aborted",
      reason: "ALREADY_ASSIGNED",
      details: { task: { id: taskId, attempt: 1 } },
    });
  });

  it("retries on another worker, fencing the old lease, and on the same one when alone", async () => {
    const w = uniqueWorkload();
    const a = await worker(`a-${w}`, { capabilities: [w] });
    const b = await worker(`b-${w}`, { capabilities: [w] });
    const taskId = await task(w);
    const first = await place(taskId);
    const retried = await placement.retry({
      taskId,
      key: "",
      correlationId: "",
      leaseSeconds: 600,
    });
    expect(retried.attempt).toBe(2);
    expect(retried.assignedWorkerId).toBe(first.assignedWorkerId === a ? b : a);
    expect(retried.leaseToken).not.toBe(first.leaseToken);
    const alone = uniqueWorkload();
    const only = await worker(`only-${alone}`, { capabilities: [alone] });
    const lone = await task(alone);
    await place(lone);
    const again = await placement.retry({
      taskId: lone,
      key: "",
      correlationId: "",
      leaseSeconds: 600,
    });
    expect(again).toMatchObject({ assignedWorkerId: only, attempt: 2 });
  });

  it("schedules only PENDING tasks and retries only ASSIGNED, RUNNING or FAILED ones", async () => {
    const w = uniqueWorkload();
    await worker(`s-${w}`, { capabilities: [w], maxConcurrency: 5 });
    const taskId = await task(w);
    await tasks.cancel(taskId, "no longer needed");
    await expect(place(taskId)).rejects.toMatchObject({ reason: "INVALID_STATE" });
    await expect(
      placement.retry({ taskId, key: "", correlationId: "", leaseSeconds: 600 }),
    ).rejects.toMatchObject({ reason: "INVALID_STATE" });
    await expect(place("00000000-0000-4000-8000-000000000000")).rejects.toMatchObject({
      kind: "not_found",
    });
  });

  it("frees the slot of an expired placement", async () => {
    const w = uniqueWorkload();
    const id = await worker(`exp-${w}`, { capabilities: [w] });
    const first = await place(await task(w));
    await expect(place(await task(w))).rejects.toMatchObject({ reason: "NO_CANDIDATE" });
    await expireLease(db().db, first.id);
    expect((await place(await task(w))).assignedWorkerId).toBe(id);
  });
});
