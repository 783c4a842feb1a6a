import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { WorkerState } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseStatus, type StreamLeasesRequestSchema } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { outcome } from "../support/errors.js";
import { expireLease } from "../support/fixtures.js";
import {
  claimOne,
  createHarness,
  type Harness,
  registerWorker,
  uniqueWorkload,
} from "../support/harness.js";

type Lease = { taskId: string; workerId: string; attempt: number; leaseToken: string };

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(() => h.close());

describe("pull-mode lifecycle over RPC", () => {
  it("registers, creates, claims, renews and completes a task", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    const { task } = await h.tasks.createTask({
      workload,
      name: "first",
      parameters: { top_k: 20 },
      steps: 2,
    });
    expect(task?.state).toBe(TaskState.PENDING);
    const claim = await claimOne(h, workerId);
    expect(claim).toMatchObject({
      taskId: task?.taskId,
      attempt: 1,
      workload,
      parameters: { top_k: 20 },
      steps: 2,
    });
    expect(claim.leaseToken).toMatch(/^[0-9a-f]{64}$/);
    const lease = { taskId: claim.taskId, workerId, attempt: 1, leaseToken: claim.leaseToken };
    const renewed = await h.leases.renewLease({
      ...lease,
      progress: { completedSteps: 1, message: "half" },
    });
    expect(renewed.cancelRequested).toBe(false);
    const { task: done } = await h.leases.completeTask({
      ...lease,
      resultSummary: "ok",
      metrics: { rows: 10 },
    });
    expect(done).toMatchObject({
      state: TaskState.SUCCEEDED,
      resultSummary: "ok",
      metrics: { rows: 10 },
    });
    expect(done?.lease?.leaseToken).toBe(""); // reads never show the token
    const { task: read } = await h.tasks.getTask({ taskId: claim.taskId });
    expect(read?.progress).toMatchObject({ completedSteps: 1, message: "half" });
  });

  it("gives tasks time-ordered ids (UUID version 7): a batch in request order, a later task after it", async () => {
    const workload = uniqueWorkload();
    const { tasks } = await h.tasks.createTasks({
      tasks: Array.from({ length: 20 }, (_, i) => ({ workload, name: `t${i}` })),
    });
    const { task: later } = await h.tasks.createTask({ workload, name: "later" });
    const ids = [...tasks.map((t) => t.taskId), later?.taskId ?? ""];
    for (const id of ids)
      expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(ids).toEqual([...ids].sort());
    // The time in an id is when the coordinator made it: about the task's
    // created_at, give or take the coordinator's and the database's clocks.
    const millis = Number.parseInt(ids[0]?.replaceAll("-", "").slice(0, 12) ?? "", 16);
    const created = tasks[0]?.createdAt;
    expect(Math.abs(millis - (created ? timestampMs(created) : 0))).toBeLessThan(60_000);
  });

  it("streams a task's changes with WatchTask and ends after the terminal state", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    const { task } = await h.tasks.createTask({ workload });
    const seen: TaskState[] = [];
    const watching = (async () => {
      for await (const res of h.tasks.watchTask({ taskId: task?.taskId ?? "" })) {
        seen.push(res.task?.state ?? TaskState.UNSPECIFIED);
        if (res.task?.state === TaskState.PENDING) {
          const claim = await claimOne(h, workerId);
          await h.leases.completeTask({ taskId: claim.taskId, workerId, attempt: claim.attempt });
        }
      }
    })();
    await watching;
    expect(seen[0]).toBe(TaskState.PENDING);
    expect(seen[seen.length - 1]).toBe(TaskState.SUCCEEDED);
  });

  it("wakes a long-polling claimer when a task is created", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    const polling = h.leases.claimTasks({ workerId, maxTasks: 4, waitSeconds: 25 });
    await new Promise((r) => setTimeout(r, 200));
    const { task } = await h.tasks.createTask({ workload });
    const { claims } = await polling;
    expect(claims.map((c) => c.taskId)).toEqual([task?.taskId]);
  });

  it("returns no claims when nothing arrives within wait_seconds", async () => {
    const workerId = await registerWorker(h, [uniqueWorkload()]);
    const { claims } = await h.leases.claimTasks({ workerId, waitSeconds: 1 });
    expect(claims).toEqual([]);
  });

  it("gives a drained worker no claims, and claims again once undrained", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({ workload });
    await h.fleet.drainWorker({ workerId, drained: true });
    expect((await h.leases.claimTasks({ workerId })).claims).toEqual([]);
    expect((await h.fleet.heartbeat({ workerId })).drained).toBe(true);
    await h.fleet.drainWorker({ workerId, drained: false });
    expect((await h.leases.claimTasks({ workerId })).claims).toHaveLength(1);
  });

  it("completes a batch, answering each completion in order with its task or error", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTasks({ tasks: [{ workload }, { workload }] });
    const { claims } = await h.leases.claimTasks({ workerId, maxTasks: 2 });
    const [a, b] = claims;
    const { results } = await h.leases.completeTasks({
      completions: [
        { taskId: a?.taskId ?? "", workerId, attempt: 1, leaseToken: a?.leaseToken ?? "" },
        { taskId: b?.taskId ?? "", workerId, attempt: 2 },
        { taskId: "not-a-uuid", workerId, attempt: 1 },
      ],
    });
    expect(results.map((r) => r.outcome.case)).toEqual(["task", "error", "error"]);
    expect(results[1]?.outcome.value).toMatchObject({ code: "aborted", reason: "STALE_ATTEMPT" });
    expect(results[2]?.outcome.value).toMatchObject({ code: "invalid_argument" });
    expect((await h.tasks.getTask({ taskId: b?.taskId ?? "" })).task?.state).toBe(
      TaskState.RUNNING,
    );
  });

  it("answers CompleteTask and CompleteTasks calls made together each with its own outcomes, in fewer statements than calls", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTasks({ tasks: Array.from({ length: 5 }, () => ({ workload })) });
    const { claims } = await h.leases.claimTasks({ workerId, maxTasks: 5 });
    expect(claims).toHaveLength(5);
    const [a, b, c, d, e] = claims.map((x) => ({
      taskId: x.taskId,
      workerId,
      attempt: x.attempt,
      leaseToken: x.leaseToken,
    })) as [Lease, Lease, Lease, Lease, Lease];
    const statements = vi.spyOn(h.app.urgent.leases, "complete");
    try {
      const [one, two, single, three, four] = await Promise.all([
        h.leases.completeTasks({ completions: [a, { ...b, attempt: 2 }] }),
        // The same completion of `a` in another call: a repeat, accepted.
        h.leases.completeTasks({ completions: [c, a] }),
        h.leases.completeTask(d),
        h.leases.completeTasks({ completions: [{ ...e, resultSummary: "first" }] }),
        h.leases.completeTasks({ completions: [{ ...e, resultSummary: "second" }] }),
      ]);
      expect(one.results.map((r) => r.outcome.case)).toEqual(["task", "error"]);
      expect(one.results[0]?.outcome.value).toMatchObject({ taskId: a.taskId });
      expect(one.results[1]?.outcome.value).toMatchObject({ reason: "STALE_ATTEMPT" });
      expect(two.results.map((r) => r.outcome.value)).toMatchObject([
        { taskId: c.taskId, state: TaskState.SUCCEEDED },
        { taskId: a.taskId, state: TaskState.SUCCEEDED },
      ]);
      expect(single.task).toMatchObject({ taskId: d.taskId, state: TaskState.SUCCEEDED });
      // Two different manifests for one attempt: one is the completion, the other a conflict.
      const forE = [three, four].map((r) => r.results[0]?.outcome);
      expect(forE.map((o) => o?.case).sort()).toEqual(["error", "task"]);
      const kept = forE.find((o) => o?.case === "task")?.value as { resultSummary: string };
      expect(forE.find((o) => o?.case === "error")?.value).toMatchObject({
        code: "already_exists",
        reason: "COMPLETION_CONFLICT",
      });
      const stored = (await h.tasks.getTask({ taskId: e.taskId })).task;
      expect(stored?.resultSummary).toBe(kept.resultSummary);
      expect((await h.tasks.getTask({ taskId: b.taskId })).task?.state).toBe(TaskState.RUNNING);
      // Group commit: the calls made while one statement ran shared the next.
      expect(statements.mock.calls.length).toBeLessThan(5);
      expect(statements.mock.calls.flatMap(([items]) => items)).toHaveLength(7);
    } finally {
      statements.mockRestore();
    }
  });

  it("retries a failed attempt after its backoff and stores the message sanitised", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({ workload, maxAttempts: 2 });
    const claim = await claimOne(h, workerId);
    const { task } = await h.leases.failTask({
      taskId: claim.taskId,
      workerId,
      attempt: 1,
      errorCode: "ValueError",
      errorMessage: `bad input in /home/lab/data/run.csv token=${claim.leaseToken}\nTraceback (most recent call last):\n  File "x.py"`,
    });
    expect(task?.state).toBe(TaskState.PENDING);
    expect(task?.notBefore).toBeDefined();
    expect(task?.error?.code).toBe("ValueError");
    expect(task?.error?.message).toBe("bad input in [path] token=[redacted]");
  });

  it("revokes the lease of a cancelled task: renewal aborted, stream says CANCELED", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({ workload });
    const claim = await claimOne(h, workerId);
    await h.tasks.cancelTask({ taskId: claim.taskId, reason: "user asked" });
    const renewal = await outcome(
      h.leases.renewLease({ taskId: claim.taskId, workerId, attempt: 1 }),
    );
    expect(renewal).toMatchObject({ code: "Aborted", reason: "TASK_CANCELED" });
    async function* one(): AsyncIterable<MessageInitShape<typeof StreamLeasesRequestSchema>> {
      yield { workerId, leases: [{ taskId: claim.taskId, attempt: 1 }] };
    }
    for await (const res of h.leases.streamLeases(one())) {
      expect(res.leases[0]?.status).toBe(LeaseStatus.CANCELED);
    }
  });

  it("deregisters a worker, releasing its leases back to PENDING with the attempt kept", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({ workload });
    const claim = await claimOne(h, workerId);
    const { releasedTaskIds } = await h.fleet.deregisterWorker({ workerId });
    expect(releasedTaskIds).toEqual([claim.taskId]);
    const { task } = await h.tasks.getTask({ taskId: claim.taskId });
    expect(task).toMatchObject({ state: TaskState.PENDING, attempt: 1 });
    expect(await outcome(h.fleet.getWorker({ workerId }))).toMatchObject({ code: "NotFound" });
  });

  it("reports fleet status: counts by state, backlog with age, worker load", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload], { maxConcurrency: 1 });
    await h.tasks.createTasks({ tasks: [{ workload }, { workload }, { workload }] });
    await claimOne(h, workerId);
    const status = await h.fleet.getFleetStatus({});
    expect(status.taskCounts.map((c) => c.state)).toEqual([
      TaskState.PENDING,
      TaskState.ASSIGNED,
      TaskState.RUNNING,
      TaskState.SUCCEEDED,
      TaskState.FAILED,
      TaskState.CANCELED,
    ]);
    expect(status.backlog.find((b) => b.workload === workload)?.pendingCount).toBe(2n);
    expect(status.workers.find((w) => w.workerId === workerId)).toMatchObject({
      state: WorkerState.ACTIVE,
      activeLeases: 1,
      maxConcurrency: 1,
      freeSlots: 0,
    });
  });

  it("returns an expired lease's task to PENDING through the sweeper", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({ workload });
    const claim = await claimOne(h, workerId);
    await expireLease(h.app.database.db, claim.taskId);
    await h.app.sweeper.runOnce();
    const { task } = await h.tasks.getTask({ taskId: claim.taskId });
    expect(task).toMatchObject({ state: TaskState.PENDING, error: { code: "LEASE_EXPIRED" } });
  });

  it("counts a worker's own calls as heartbeats", async () => {
    const workerId = await registerWorker(h, [uniqueWorkload()]);
    const before = (await h.fleet.getWorker({ workerId })).worker?.lastHeartbeatAt;
    await new Promise((r) => setTimeout(r, 20));
    await h.leases.claimTasks({ workerId });
    await h.app.sweeper.runOnce();
    const after = (await h.fleet.getWorker({ workerId })).worker?.lastHeartbeatAt;
    expect(Number(after?.seconds) * 1e9 + (after?.nanos ?? 0)).toBeGreaterThan(
      Number(before?.seconds) * 1e9 + (before?.nanos ?? 0),
    );
  });
});
