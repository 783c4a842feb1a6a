import { randomUUID } from "node:crypto";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type TaskEvent, TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { outcome } from "../support/errors.js";
import { endBackoff, expireLease } from "../support/fixtures.js";
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

/** The whole history of a task, every page. */
async function history(taskId: string, pageSize = 0): Promise<TaskEvent[]> {
  const events: TaskEvent[] = [];
  let pageToken = "";
  do {
    const page = await h.tasks.listTaskEvents({ taskId, pageSize, pageToken });
    events.push(...page.events);
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
  return events;
}

const brief = (e: TaskEvent) => ({
  state: TaskState[e.state],
  attempt: e.attempt,
  workerId: e.workerId,
  errorCode: e.errorCode,
});

describe("ListTaskEvents: a task's history", () => {
  it("records creation, each claim, a failure, an expiry and the completion, in order, with the worker", async () => {
    const workload = uniqueWorkload();
    const w1 = await registerWorker(h, [workload]);
    const { task } = await h.tasks.createTask({ workload, maxAttempts: 5 });
    const taskId = task?.taskId ?? "";

    // Attempt 1: claimed, started, renewed (not an event), failed (retryable).
    const c1 = await claimOne(h, w1);
    const lease1 = { taskId, workerId: w1, attempt: c1.attempt, leaseToken: c1.leaseToken };
    await h.leases.startTask(lease1);
    await h.leases.renewLease({ ...lease1, progress: { completedSteps: 1, message: "half" } });
    await h.leases.failTask({
      ...lease1,
      errorCode: "OOM",
      errorMessage: "out of memory",
      retryable: true,
    });
    await endBackoff(h.app.database.db, taskId);

    // Attempt 2: claimed by another worker, whose lease then runs out (the sweeper).
    const w2 = await registerWorker(h, [workload]);
    const c2 = await claimOne(h, w2);
    expect(c2.attempt).toBe(2);
    await expireLease(h.app.database.db, taskId);
    await h.app.sweeper.runOnce();

    // Attempt 3: completed by the first worker.
    const c3 = await claimOne(h, w1);
    await h.leases.completeTask({
      taskId,
      workerId: w1,
      attempt: c3.attempt,
      leaseToken: c3.leaseToken,
    });

    const events = await history(taskId);
    // A pull claim leases the task RUNNING at once (ASSIGNED is push placement's).
    expect(events.map(brief)).toEqual([
      { state: "PENDING", attempt: 0, workerId: "", errorCode: "" },
      { state: "RUNNING", attempt: 1, workerId: w1, errorCode: "" },
      { state: "PENDING", attempt: 1, workerId: w1, errorCode: "OOM" },
      { state: "RUNNING", attempt: 2, workerId: w2, errorCode: "" },
      { state: "PENDING", attempt: 2, workerId: w2, errorCode: "LEASE_EXPIRED" },
      { state: "RUNNING", attempt: 3, workerId: w1, errorCode: "" },
      { state: "SUCCEEDED", attempt: 3, workerId: w1, errorCode: "" },
    ]);
    expect(events.find((e) => e.errorCode === "OOM")?.errorMessage).toBe("out of memory");
    // Oldest first, by sequence and by time.
    const sequences = events.map((e) => e.sequence);
    expect([...sequences].sort((a, b) => (a < b ? -1 : 1))).toEqual(sequences);
    const times = events.map((e) => Number(e.time?.seconds) * 1e3 + (e.time?.nanos ?? 0) / 1e6);
    expect([...times].sort((a, b) => a - b)).toEqual(times);
  });

  it("pages: the same events one at a time as all at once", async () => {
    const workload = uniqueWorkload();
    const worker = await registerWorker(h, [workload]);
    const { task } = await h.tasks.createTask({ workload });
    const c = await claimOne(h, worker);
    await h.leases.completeTask({
      taskId: c.taskId,
      workerId: worker,
      attempt: 1,
      leaseToken: c.leaseToken,
    });
    const all = await history(task?.taskId ?? "");
    expect(all).toHaveLength(3);
    expect((await history(task?.taskId ?? "", 1)).map((e) => e.sequence)).toEqual(
      all.map((e) => e.sequence),
    );
  });

  it("records a batch create and a cancel made by a client", async () => {
    const workload = uniqueWorkload();
    const { tasks } = await h.tasks.createTasks({ tasks: [{ workload }, { workload }] });
    const [a, b] = tasks.map((t) => t.taskId);
    await h.tasks.cancelTask({ taskId: a ?? "", reason: "not needed" });
    expect((await history(a ?? "")).map(brief)).toEqual([
      { state: "PENDING", attempt: 0, workerId: "", errorCode: "" },
      { state: "CANCELED", attempt: 0, workerId: "", errorCode: "CANCELED" },
    ]);
    expect((await history(b ?? "")).map((e) => TaskState[e.state])).toEqual(["PENDING"]);
  });

  it("goes with its task, and only with its own: a delete of several tasks takes their events", async () => {
    const workload = uniqueWorkload();
    const { tasks } = await h.tasks.createTasks({
      tasks: [{ workload }, { workload }, { workload }],
    });
    const [a, b, kept] = tasks.map((t) => t.taskId);
    for (const taskId of [a, b, kept]) await h.tasks.cancelTask({ taskId, reason: "old" });
    for (const taskId of [a, b, kept]) expect(await countLeft(taskId ?? "")).toBe(2);
    await h.app.database.db.execute(
      sql`delete from tasks where id in (${a ?? ""}::uuid, ${b ?? ""}::uuid)`,
    );
    expect(await countLeft(a ?? "")).toBe(0);
    expect(await countLeft(b ?? "")).toBe(0);
    expect((await history(kept ?? "")).map((e) => TaskState[e.state])).toEqual([
      "PENDING",
      "CANCELED",
    ]);
  });

  it("answers not_found for an unknown task and invalid_argument for a bad id, page size or token", async () => {
    expect(await outcome(h.tasks.listTaskEvents({ taskId: randomUUID() }))).toMatchObject({
      code: "NotFound",
    });
    expect(await outcome(h.tasks.listTaskEvents({ taskId: "nope" }))).toMatchObject({
      code: "InvalidArgument",
    });
    const { task } = await h.tasks.createTask({ workload: uniqueWorkload() });
    const taskId = task?.taskId ?? "";
    for (const bad of [{ pageSize: -1 }, { pageSize: 1001 }, { pageToken: "garbage" }]) {
      expect(await outcome(h.tasks.listTaskEvents({ taskId, ...bad }))).toMatchObject({
        code: "InvalidArgument",
      });
    }
  });

  it("is a client's (and admin's) read: a worker token is refused", async () => {
    const secured = await createHarness({ auth: "on" });
    try {
      const asClient = secured.as(TaskService, await secured.token("client"));
      const { task } = await asClient.createTask({ workload: uniqueWorkload() });
      const taskId = task?.taskId ?? "";
      expect((await asClient.listTaskEvents({ taskId })).events).toHaveLength(1);
      const asWorker = secured.as(TaskService, await secured.token("worker"));
      expect(await outcome(asWorker.listTaskEvents({ taskId }))).toMatchObject({
        code: "PermissionDenied",
      });
    } finally {
      await secured.close();
    }
  });
});

/** The events left for a task, whatever shape the driver gives a raw result. */
async function countLeft(taskId: string): Promise<number> {
  const result = (await h.app.database.db.execute(
    sql`select count(*)::int as n from task_events where task_id = ${taskId}`,
  )) as unknown as { n: number }[] | { rows: { n: number }[] };
  const rows = Array.isArray(result) ? result : result.rows;
  return rows[0]?.n ?? -1;
}
