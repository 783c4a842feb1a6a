import { ConnectError } from "@connectrpc/connect";
import { eq, sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TaskSchema, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { workers } from "../../src/db/schema/index.js";
import { outcome } from "../support/errors.js";
import { expireLease } from "../support/fixtures.js";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(() => h.close());

interface WorkerSpec {
  name: string;
  capabilities?: string[];
  labels?: Record<string, string>;
  apiBaseUrl?: string;
  maxConcurrency?: number;
}

async function worker(spec: WorkerSpec): Promise<string> {
  const { workerId } = await h.fleet.registerWorker({
    name: spec.name,
    capabilities: spec.capabilities ?? [],
    labels: spec.labels ?? {},
    apiBaseUrl: spec.apiBaseUrl ?? `http://${spec.name}.example:8080/`,
    maxConcurrency: spec.maxConcurrency ?? 1,
  });
  return workerId;
}

async function task(
  workload: string,
  extra: { affinity?: Record<string, string>; requiredCapabilities?: string[] } = {},
) {
  const { task } = await h.tasks.createTask({ workload, ...extra });
  return task?.taskId ?? "";
}

describe("push placement", () => {
  it("places a task on a fitting worker with a lease token, and the worker runs it to completion", async () => {
    const w = uniqueWorkload();
    const workerId = await worker({ name: "push-1", capabilities: [w] });
    const taskId = await task(w);
    const { task: placed } = await h.tasks.scheduleTask({ taskId, leaseSeconds: 120 });
    expect(placed).toMatchObject({
      state: TaskState.ASSIGNED,
      attempt: 1,
      assignedWorkerId: workerId,
      assignedApiBaseUrl: "http://push-1.example:8080/",
    });
    expect(placed?.lease?.leaseToken).toMatch(/^[0-9a-f]{64}$/);
    const lease = { taskId, workerId, attempt: 1, leaseToken: placed?.lease?.leaseToken ?? "" };
    expect((await h.leases.startTask(lease)).task?.state).toBe(TaskState.RUNNING);
    // A retried StartTask (its answer lost) succeeds again; another attempt does not.
    expect((await h.leases.startTask(lease)).task?.state).toBe(TaskState.RUNNING);
    expect(await outcome(h.leases.startTask({ ...lease, attempt: 2 }))).toMatchObject({
      code: "Aborted",
      reason: "STALE_ATTEMPT",
    });
    const renewed = await h.leases.renewLease({ ...lease, extendSeconds: 3600 });
    expect(Number(renewed.leaseExpiresAt?.seconds) * 1000 - Date.now()).toBeGreaterThan(3_500_000);
    expect((await h.leases.completeTask(lease)).task?.state).toBe(TaskState.SUCCEEDED);
  });

  it("refuses each worker that fails one rule, naming why", async () => {
    const w = uniqueWorkload();
    const fit = { capabilities: [w, "gpu"], labels: { zone: "a" } };
    const drained = await worker({ name: "drained-one", ...fit });
    await h.fleet.drainWorker({ workerId: drained, drained: true });
    const lostId = await worker({ name: "lost-one", ...fit });
    await h.app.database.db
      .update(workers)
      .set({ lastHeartbeatAt: sql`now() - interval '1 hour'` })
      .where(eq(workers.id, lostId));
    await worker({ name: "no-url", ...fit, apiBaseUrl: "" });
    await worker({ name: "wrong-zone", capabilities: [w, "gpu"], labels: { zone: "b" } });
    await worker({ name: "no-gpu", capabilities: [w], labels: { zone: "a" } });
    const busy = await worker({ name: "busy", ...fit });
    const blocker = await task(w);
    await h.app.database.db.execute(
      sql`update tasks set state = 'RUNNING', attempt = 1, lease_worker_id = ${busy}, lease_expires_at = now() + interval '1 hour' where id = ${blocker}`,
    );
    const taskId = await task(w, { affinity: { zone: "a" }, requiredCapabilities: ["gpu"] });
    const res = await outcome(h.tasks.scheduleTask({ taskId }));
    expect(res.code).toBe("FailedPrecondition");
    for (const reason of [
      "drained-one: drained",
      "lost-one: lost (no heartbeat for 3 intervals)",
      "no-url: no api_base_url",
      "wrong-zone: label zone is not a",
      "no-gpu: missing capability gpu",
      "busy: no free slot (1/1)",
    ]) {
      expect(res.message).toContain(reason);
    }
    expect((await h.tasks.getTask({ taskId })).task?.state).toBe(TaskState.PENDING);
    // A label value brick:<id> counts as capability <id>.
    const brick = await worker({
      name: "brick",
      capabilities: [w],
      labels: { zone: "a", b1: "brick:gpu" },
    });
    expect((await h.tasks.scheduleTask({ taskId })).task?.assignedWorkerId).toBe(brick);
  });

  it("keeps a placed task from other claimers while its lease lives; the sweeper frees an expired one", async () => {
    const w = uniqueWorkload();
    const a = await worker({ name: "holder-a", capabilities: [w], maxConcurrency: 5 });
    const b = await worker({ name: "holder-b", capabilities: [w], maxConcurrency: 5 });
    const taskId = await task(w);
    const placedOn = (await h.tasks.scheduleTask({ taskId })).task?.assignedWorkerId ?? "";
    const other = placedOn === a ? b : a;
    expect((await h.leases.claimTasks({ workerId: other, maxTasks: 5 })).claims).toEqual([]);
    expect((await h.fleet.getWorker({ workerId: placedOn })).worker?.activeLeases).toBe(1);
    await expireLease(h.app.database.db, taskId);
    await h.app.sweeper.runOnce();
    expect((await h.tasks.getTask({ taskId })).task).toMatchObject({
      state: TaskState.PENDING,
      assignedWorkerId: "",
      error: { code: "LEASE_EXPIRED" },
    });
    expect((await h.leases.claimTasks({ workerId: other })).claims[0]?.taskId).toBe(taskId);
  });

  it("orders candidates by free slots, then queue depth, then heartbeat recency", async () => {
    const w = uniqueWorkload();
    const roomy = await worker({ name: "roomy", capabilities: [w], maxConcurrency: 4 });
    const small = await worker({ name: "small", capabilities: [w], maxConcurrency: 2 });
    expect((await h.tasks.scheduleTask({ taskId: await task(w) })).task?.assignedWorkerId).toBe(
      roomy,
    );
    expect((await h.tasks.scheduleTask({ taskId: await task(w) })).task?.assignedWorkerId).toBe(
      roomy,
    );
    // roomy 2 free, small 2 free: the lower queue depth wins.
    await h.fleet.heartbeat({ workerId: roomy, queueDepth: 5 });
    await h.fleet.heartbeat({ workerId: small, queueDepth: 1 });
    expect((await h.tasks.scheduleTask({ taskId: await task(w) })).task?.assignedWorkerId).toBe(
      small,
    );
    // roomy 2, small 1 free: free slots first.
    expect((await h.tasks.scheduleTask({ taskId: await task(w) })).task?.assignedWorkerId).toBe(
      roomy,
    );
    // roomy 1, small 1, equal depth: the most recent heartbeat wins (roomy's
    // is moved a second back: two heartbeats can land in the same millisecond).
    await h.fleet.heartbeat({ workerId: roomy, queueDepth: 0 });
    await h.fleet.heartbeat({ workerId: small, queueDepth: 0 });
    await h.db.database.db
      .update(workers)
      .set({ lastHeartbeatAt: sql`now() - interval '1 second'` })
      .where(eq(workers.id, roomy));
    expect((await h.tasks.scheduleTask({ taskId: await task(w) })).task?.assignedWorkerId).toBe(
      small,
    );
  });

  it("returns the same assignment for the same key and refuses another key with the task attached", async () => {
    const w = uniqueWorkload();
    await worker({ name: "k1", capabilities: [w], maxConcurrency: 3 });
    const taskId = await task(w);
    const first = await h.tasks.scheduleTask({
      taskId,
      scheduleIdempotencyKey: "a",
      correlationId: "c-1",
    });
    const again = await h.tasks.scheduleTask({ taskId, scheduleIdempotencyKey: "a" });
    expect(again.task?.lease?.leaseToken).toBe(first.task?.lease?.leaseToken);
    expect(again.task?.attempt).toBe(1);
    expect(first.task?.correlationId).toBe("c-1");
    try {
      await h.tasks.scheduleTask({ taskId, scheduleIdempotencyKey: "b" });
      expect.unreachable();
    } catch (error) {
      const e = ConnectError.from(error);
      expect(e.code).toBe(10); // aborted → HTTP 409
      const [current] = e.findDetails(TaskSchema);
      expect(current).toMatchObject({ taskId, state: TaskState.ASSIGNED, attempt: 1 });
      expect(current?.lease?.leaseToken).toBe("");
    }
  });

  it("retries on another worker, fencing the old holder, and falls back to it when alone", async () => {
    const w = uniqueWorkload();
    const a = await worker({ name: "ra", capabilities: [w], maxConcurrency: 2 });
    const b = await worker({ name: "rb", capabilities: [w], maxConcurrency: 2 });
    const taskId = await task(w);
    const first = (await h.tasks.scheduleTask({ taskId })).task;
    const firstWorker = first?.assignedWorkerId ?? "";
    const second = (await h.tasks.retryTask({ taskId })).task;
    expect(second?.assignedWorkerId).toBe(firstWorker === a ? b : a);
    expect(second?.attempt).toBe(2);
    const stale = await outcome(
      h.leases.renewLease({
        taskId,
        workerId: firstWorker,
        attempt: 1,
        leaseToken: first?.lease?.leaseToken ?? "",
      }),
    );
    expect(stale).toMatchObject({ code: "Aborted", reason: "STALE_ATTEMPT" });
    // Alone: the previous worker is taken again.
    const solo = uniqueWorkload();
    const only = await worker({ name: "solo", capabilities: [solo] });
    const t2 = await task(solo);
    await h.tasks.scheduleTask({ taskId: t2 });
    expect((await h.tasks.retryTask({ taskId: t2 })).task?.assignedWorkerId).toBe(only);
  });

  it("migrates for a checkpoint: the placement is released and the next claim gets the handle", async () => {
    const w = uniqueWorkload();
    const workerId = await worker({ name: "mig", capabilities: [w], maxConcurrency: 2 });
    const taskId = await task(w);
    const placed = (await h.tasks.scheduleTask({ taskId })).task;
    const released = await h.leases.releaseTask({
      taskId,
      workerId,
      attempt: 1,
      leaseToken: placed?.lease?.leaseToken ?? "",
      checkpointHandle: "s3://bucket/ckpt-7",
    });
    expect(released.task).toMatchObject({
      state: TaskState.PENDING,
      assignedWorkerId: "",
      checkpointHandle: "s3://bucket/ckpt-7",
    });
    const { claims } = await h.leases.claimTasks({ workerId });
    expect(claims[0]).toMatchObject({ taskId, attempt: 2, checkpointHandle: "s3://bucket/ckpt-7" });
  });

  it("refuses a schedule lease outside 60–86400 seconds and placing a task that is not PENDING", async () => {
    const w = uniqueWorkload();
    await worker({ name: "bounds", capabilities: [w] });
    const taskId = await task(w);
    expect((await outcome(h.tasks.scheduleTask({ taskId, leaseSeconds: 59 }))).code).toBe(
      "InvalidArgument",
    );
    await h.tasks.cancelTask({ taskId });
    expect((await outcome(h.tasks.scheduleTask({ taskId }))).code).toBe("FailedPrecondition");
  });
});
