import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { outcome } from "../support/errors.js";
import {
  claimOne,
  createHarness,
  type Harness,
  registerWorker,
  uniqueWorkload,
} from "../support/harness.js";

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(() => h.close());

/** A task of a new workload that failed at its first attempt (not retryable), and its lease. */
async function failedTask(maxAttempts = 1) {
  const workload = uniqueWorkload();
  const workerId = await registerWorker(h, [workload]);
  const { task } = await h.tasks.createTask({
    workload,
    maxAttempts,
    parameters: { frame: 7 },
    input: { case: "inputData", value: new TextEncoder().encode("scene") },
  });
  if (!task) throw new Error("no task");
  const claim = await claimOne(h, workerId);
  const lease = {
    taskId: claim.taskId,
    workerId,
    attempt: claim.attempt,
    leaseToken: claim.leaseToken,
  };
  await h.leases.renewLease({ ...lease, progress: { completedSteps: 1, message: "half" } });
  await h.leases.failTask({
    ...lease,
    errorCode: "ValueError",
    errorMessage: "bad row",
    retryable: false,
  });
  return { task, workload, workerId, lease };
}

describe("RerunTask", () => {
  it("puts a FAILED task back to PENDING with its id, input and parameters, a fresh budget and a rerun event", async () => {
    const { task, workerId, lease } = await failedTask();
    const { task: rerun } = await h.tasks.rerunTask({ taskId: task.taskId });
    expect(rerun).toMatchObject({
      taskId: task.taskId,
      state: TaskState.PENDING,
      attempt: 1,
      parameters: { frame: 7 },
    });
    expect(rerun?.input?.artifactId).toBe(task.input?.artifactId);
    expect(rerun?.error).toBeUndefined();
    expect(rerun?.progress?.completedSteps ?? 0).toBe(0);
    expect(rerun?.lease).toBeUndefined();
    expect(rerun?.finishedAt).toBeUndefined();

    // The worker of the failed attempt is fenced: its lease is gone.
    const stale = await outcome(h.leases.completeTask(lease));
    expect(stale).toMatchObject({ code: "Aborted" });

    // Claimed again under the next attempt, with max_attempts (1) counting afresh.
    const again = await claimOne(h, workerId);
    expect(again).toMatchObject({ taskId: task.taskId, attempt: 2 });
    const staleAgain = await outcome(h.leases.completeTask(lease));
    expect(staleAgain).toMatchObject({ code: "Aborted" });
    const { task: done } = await h.leases.completeTask({
      taskId: again.taskId,
      workerId,
      attempt: 2,
      leaseToken: again.leaseToken,
    });
    expect(done?.state).toBe(TaskState.SUCCEEDED);

    const { events } = await h.tasks.listTaskEvents({ taskId: task.taskId });
    const states = events.map((e) => [TaskState[e.state], e.attempt, e.errorCode]);
    expect(states).toEqual([
      ["PENDING", 0, ""],
      ["RUNNING", 1, ""],
      ["FAILED", 1, "ValueError"],
      ["PENDING", 1, "RERUN"],
      ["RUNNING", 2, ""],
      ["SUCCEEDED", 2, ""],
    ]);
  });

  it("gives the whole attempt budget again: a task of 2 attempts that failed its first retries once more", async () => {
    const { task, workerId } = await failedTask(2);
    await h.tasks.rerunTask({ taskId: task.taskId });
    const next = await claimOne(h, workerId);
    expect(next.attempt).toBe(2);
    const lease = { taskId: next.taskId, workerId, attempt: 2, leaseToken: next.leaseToken };
    // Without a fresh budget, attempt 2 of 2 would be the last.
    const { task: retried } = await h.leases.failTask({ ...lease, errorCode: "E" });
    expect(retried?.state).toBe(TaskState.PENDING);
  });

  it("reruns a CANCELED task, and refuses a live or SUCCEEDED one with INVALID_STATE, changing nothing", async () => {
    const workload = uniqueWorkload();
    const { task } = await h.tasks.createTask({ workload });
    if (!task) throw new Error("no task");
    const live = await outcome(h.tasks.rerunTask({ taskId: task.taskId }));
    expect(live).toMatchObject({ code: "FailedPrecondition", reason: "INVALID_STATE" });
    await h.tasks.cancelTask({ taskId: task.taskId });
    const { task: rerun } = await h.tasks.rerunTask({ taskId: task.taskId });
    expect(rerun?.state).toBe(TaskState.PENDING);
    const unknown = await outcome(
      h.tasks.rerunTask({ taskId: "00000000-0000-4000-8000-000000000000" }),
    );
    expect(unknown).toMatchObject({ code: "NotFound" });
    const bad = await outcome(h.tasks.rerunTask({ taskId: "render-1" }));
    expect(bad).toMatchObject({ code: "InvalidArgument" });
  });
});

describe("RerunTasks and CancelTasks by filter", () => {
  it("count with dry_run, then act on exactly what the filter matches", async () => {
    const workload = uniqueWorkload();
    const other = uniqueWorkload();
    const { tasks } = await h.tasks.createTasks({
      tasks: [...Array(5).fill({ workload }), { workload: other }],
    });
    const ids = tasks.map((t) => t.taskId);
    const filter = { workload };
    expect((await h.tasks.cancelTasks({ filter, dryRun: true })).count).toBe(5);
    expect((await h.tasks.getTask({ taskId: ids[0] })).task?.state).toBe(TaskState.PENDING);
    expect((await h.tasks.cancelTasks({ filter, reason: "wrong scene" })).count).toBe(5);
    const { task: canceled } = await h.tasks.getTask({ taskId: ids[0] });
    expect(canceled).toMatchObject({
      state: TaskState.CANCELED,
      error: { message: "wrong scene" },
    });
    expect((await h.tasks.getTask({ taskId: ids[5] })).task?.state).toBe(TaskState.PENDING);
    // Nothing left to cancel: terminal tasks are not matched.
    expect((await h.tasks.cancelTasks({ filter })).count).toBe(0);

    // Rerun two of them by id, then the rest by state and creation range.
    const two = { taskIds: ids.slice(0, 2) };
    expect((await h.tasks.rerunTasks({ filter: two, dryRun: true })).count).toBe(2);
    expect((await h.tasks.rerunTasks({ filter: two })).count).toBe(2);
    const created = tasks[0]?.createdAt;
    if (!created) throw new Error("no create time");
    const rest = {
      workload,
      states: [TaskState.CANCELED],
      createdAfter: created,
      createdBefore: timestampFromDate(new Date(Date.now() + 60_000)),
    };
    expect((await h.tasks.rerunTasks({ filter: rest })).count).toBe(3);
    const { tasks: now } = await h.tasks.listTasks({ workload });
    expect(now.map((t) => t.state)).toEqual(Array(5).fill(TaskState.PENDING));
  });

  it("refuse an empty filter and a state the operation cannot act on, changing nothing", async () => {
    const workload = uniqueWorkload();
    await h.tasks.createTask({ workload });
    expect(await outcome(h.tasks.cancelTasks({}))).toMatchObject({ code: "InvalidArgument" });
    expect(await outcome(h.tasks.rerunTasks({ filter: {} }))).toMatchObject({
      code: "InvalidArgument",
    });
    const wrong = await outcome(
      h.tasks.rerunTasks({ filter: { workload, states: [TaskState.PENDING] } }),
    );
    expect(wrong).toMatchObject({ code: "InvalidArgument" });
    expect(wrong.message).toContain("FAILED, CANCELED");
    const badId = await outcome(h.tasks.cancelTasks({ filter: { taskIds: ["x"] } }));
    expect(badId).toMatchObject({ code: "InvalidArgument" });
    expect((await h.tasks.listTasks({ workload })).tasks[0]?.state).toBe(TaskState.PENDING);
  });
});
