import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  LeaseStatus,
  type LeaseUpdate,
  type StreamLeasesRequestSchema,
} from "../../gen/meshwork/v1/lease_pb.js";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { within } from "../support/bounded.js";
import { outcome } from "../support/errors.js";
import { endBackoff, expireLease } from "../support/fixtures.js";
import {
  claimOne,
  createHarness,
  type Harness,
  registerWorker,
  uniqueWorkload,
} from "../support/harness.js";

type LeaseEntry = MessageInitShape<typeof StreamLeasesRequestSchema>["leases"];

/** Sends one StreamLeases message and returns the lease updates of its answer. */
async function streamOnce(
  h: Harness,
  workerId: string,
  leases: NonNullable<LeaseEntry>,
): Promise<LeaseUpdate[]> {
  async function* one(): AsyncIterable<MessageInitShape<typeof StreamLeasesRequestSchema>> {
    yield { workerId, leases };
  }
  const updates: LeaseUpdate[] = [];
  for await (const res of h.leases.streamLeases(one())) updates.push(...res.leases);
  return updates;
}

describe("StreamLeases renewals", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await createHarness();
  });
  afterAll(() => h.close());

  it("reports LOST with TOKEN_MISMATCH for another lease's token, and the expiry stays as it was", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({ workload });
    const claim = await claimOne(h, workerId);
    const expiry = async () => (await h.tasks.getTask({ taskId: claim.taskId })).task?.lease;
    const before = await expiry();
    const [wrong] = await streamOnce(h, workerId, [
      { taskId: claim.taskId, attempt: 1, leaseToken: "f".repeat(64) },
    ]);
    expect(wrong).toMatchObject({ status: LeaseStatus.LOST, reason: "TOKEN_MISMATCH" });
    expect(await expiry()).toEqual(before);
    const [right] = await streamOnce(h, workerId, [
      { taskId: claim.taskId, attempt: 1, leaseToken: claim.leaseToken },
    ]);
    expect(right?.status).toBe(LeaseStatus.RENEWED);
  });

  it("reports LOST with LEASE_EXPIRED for a lease that ran out, and another worker can claim the task", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({ workload });
    const claim = await claimOne(h, workerId);
    await expireLease(h.app.database.db, claim.taskId);
    const [update] = await streamOnce(h, workerId, [
      { taskId: claim.taskId, attempt: 1, leaseToken: claim.leaseToken },
    ]);
    expect(update).toMatchObject({ status: LeaseStatus.LOST, reason: "LEASE_EXPIRED" });
    const other = await registerWorker(h, [workload]);
    expect(await claimOne(h, other)).toMatchObject({ taskId: claim.taskId, attempt: 2 });
  });
});

describe("a lease named by task_id and lease_token alone", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await createHarness();
  });
  afterAll(() => h.close());

  it("renews (answering the task), refuses another or an old token, and completes once", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({ workload });
    const claim = await claimOne(h, workerId);
    const byToken = { taskId: claim.taskId, leaseToken: claim.leaseToken };

    const renewed = await h.leases.renewLease({ ...byToken, extendSeconds: 3600 });
    expect(renewed.task).toMatchObject({
      taskId: claim.taskId,
      state: TaskState.RUNNING,
      lease: { workerId, attempt: 1, leaseToken: "" },
    });
    expect(renewed.task?.lease?.expiresAt).toEqual(renewed.leaseExpiresAt);

    const other = `${claim.leaseToken.slice(0, -1)}${claim.leaseToken.endsWith("0") ? "1" : "0"}`;
    for (const call of [
      () => h.leases.renewLease({ ...byToken, leaseToken: other }),
      () => h.leases.completeTask({ ...byToken, leaseToken: other }),
      () => h.leases.failTask({ ...byToken, leaseToken: other, errorCode: "X" }),
    ]) {
      expect(await outcome(call())).toMatchObject({ code: "Aborted", reason: "TOKEN_MISMATCH" });
    }
    expect((await h.tasks.getTask({ taskId: claim.taskId })).task?.lease?.expiresAt).toEqual(
      renewed.leaseExpiresAt,
    );

    // The lease expires and another worker takes the task: the old token
    // names no lease any more.
    await expireLease(h.app.database.db, claim.taskId);
    const next = await claimOne(h, await registerWorker(h, [workload]));
    expect(next.attempt).toBe(2);
    expect(await outcome(h.leases.completeTask(byToken))).toMatchObject({
      code: "Aborted",
      reason: "TOKEN_MISMATCH",
    });
    const done = await h.leases.completeTask({
      taskId: next.taskId,
      leaseToken: next.leaseToken,
    });
    expect(done.task).toMatchObject({ state: TaskState.SUCCEEDED, attempt: 2 });
    // Repeated, the same completion is the same success (CompleteTask's rule).
    const again = await h.leases.completeTask({
      taskId: next.taskId,
      leaseToken: next.leaseToken,
    });
    expect(again.task?.state).toBe(TaskState.SUCCEEDED);
  });
});

// A harness of its own: any other sweep that returns a task to PENDING would
// also wake the poll and hide a missing retry wake-up.
describe("long-poll wake-up when a retry's backoff ends", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await createHarness();
  });
  afterAll(() => h.close());

  it("hands a failed task to a long-polling ClaimTasks when its backoff passes, without waiting out wait_seconds", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({
      workload,
      retryBackoff: { initial: { seconds: 60n }, max: { seconds: 60n }, multiplier: 2 },
    });
    const claim = await claimOne(h, workerId);
    const { task } = await h.leases.failTask({
      taskId: claim.taskId,
      workerId,
      attempt: 1,
      leaseToken: claim.leaseToken,
      errorCode: "Flaky",
      retryable: true,
    });
    expect(task?.state).toBe(TaskState.PENDING);
    const polling = h.leases.claimTasks({ workerId, maxTasks: 4, waitSeconds: 25 });
    await new Promise((r) => setTimeout(r, 200));
    await endBackoff(h.app.database.db, claim.taskId);
    await h.app.sweeper.runOnce();
    // A bound well inside wait_seconds, so a missing wake-up fails instead of
    // passing on the poll's own timeout.
    const res = await within(10_000, polling);
    expect(res === "timed out" ? res : res.claims.map((c) => [c.taskId, c.attempt])).toEqual([
      [claim.taskId, 2],
    ]);
  });
});

describe("the sweeper and deadlines", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await createHarness();
  });
  afterAll(() => h.close());

  it("fails a PENDING task whose deadline passed (DEADLINE_EXCEEDED) and tells its watcher", async () => {
    const { task } = await h.tasks.createTask({
      workload: uniqueWorkload(),
      deadline: timestampFromDate(new Date(Date.now() - 1000)),
    });
    const taskId = task?.taskId ?? "";
    const seen: TaskState[] = [];
    const watching = (async () => {
      for await (const res of h.tasks.watchTask({ taskId }))
        if (res.task) seen.push(res.task.state);
    })();
    await h.app.sweeper.runOnce();
    expect(await within(10_000, watching)).not.toBe("timed out");
    const { task: after } = await h.tasks.getTask({ taskId });
    expect(after).toMatchObject({ state: TaskState.FAILED, error: { code: "DEADLINE_EXCEEDED" } });
    expect(seen.at(-1)).toBe(TaskState.FAILED);
  });
});
