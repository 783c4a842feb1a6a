import { createHash } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ArtifactKind, ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import type { Claim } from "../../gen/meshwork/v1/lease_pb.js";
import {
  type CreateTaskRequestSchema,
  DependencyPolicy,
  TaskState,
  WaitKind,
} from "../../gen/meshwork/v1/task_pb.js";
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

const leaseOf = (c: Claim, workerId: string) => ({
  taskId: c.taskId,
  workerId,
  attempt: c.attempt,
  leaseToken: c.leaseToken,
});

/** Uploads `text` as an OUTPUT artifact of the claim's attempt; returns its ref. */
async function upload(c: Claim, workerId: string, filename: string, text: string) {
  const bytes = new TextEncoder().encode(text);
  const artifacts = createClient(ArtifactService, h.transport);
  async function* body() {
    yield {
      payload: {
        case: "header" as const,
        value: {
          ...leaseOf(c, workerId),
          filename,
          kind: ArtifactKind.OUTPUT,
          sha256: createHash("sha256").update(bytes).digest("hex"),
        },
      },
    };
    yield { payload: { case: "chunk" as const, value: bytes } };
  }
  const { artifact } = await artifacts.uploadArtifact(body());
  if (!artifact) throw new Error("no artifact");
  const { artifactId, uri, sha256, sizeBytes, contentType } = artifact;
  return { artifactId, uri, sha256, sizeBytes, contentType };
}

async function waitUntil(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`gave up waiting for ${what}`);
}

describe("delayed tasks", () => {
  it("holds a task with a delay back until it is due, says why, then a parked claim gets it", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    const { task } = await h.tasks.createTask({
      workload,
      start: { case: "delay", value: durationFromMs(1500) },
    });
    expect(task?.runAt).toBeDefined();
    const { claims } = await h.leases.claimTasks({ workerId, maxTasks: 1 });
    expect(claims).toEqual([]);
    const got = await h.tasks.getTask({ taskId: task?.taskId ?? "" });
    expect(got.waiting.map((w) => w.kind)).toContain(WaitKind.NOT_BEFORE);
    const placed = await outcome(h.tasks.scheduleTask({ taskId: task?.taskId ?? "" }));
    expect(placed).toMatchObject({ code: "FailedPrecondition", reason: "INVALID_STATE" });

    // A claim parked now is woken by the sweeper once the task falls due.
    const parked = h.leases.claimTasks({ workerId, maxTasks: 1, waitSeconds: 20 });
    await waitUntil(async () => {
      const { task: t } = await h.tasks.getTask({ taskId: task?.taskId ?? "" });
      const due = (t?.runAt?.seconds ?? 0n) * 1000n + BigInt((t?.runAt?.nanos ?? 0) / 1e6);
      return BigInt(Date.now()) > due + 100n;
    }, "the run_at to pass");
    await h.app.sweeper.runOnce();
    const { claims: woken } = await parked;
    expect(woken.map((c) => c.taskId)).toEqual([task?.taskId]);
  });

  it("takes run_at, refuses both bad times and leaves nothing created", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    const past = await h.tasks.createTask({
      workload,
      start: { case: "runAt", value: timestampFromDate(new Date(Date.now() - 60_000)) },
    });
    expect((await claimOne(h, workerId)).taskId).toBe(past.task?.taskId);
    const far = await outcome(
      h.tasks.createTask({
        workload,
        start: { case: "runAt", value: timestampFromDate(new Date(Date.now() + 400 * 86_400_000)) },
      }),
    );
    expect(far).toMatchObject({ code: "InvalidArgument" });
    const negative = await outcome(
      h.tasks.createTask({ workload, start: { case: "delay", value: { seconds: -5n, nanos: 0 } } }),
    );
    expect(negative).toMatchObject({ code: "InvalidArgument" });
    const { tasks } = await h.tasks.listTasks({ workload });
    expect(tasks).toHaveLength(1);
  });
});

describe("dependencies", () => {
  it("runs a graph of 1,000 tasks submitted in one call in dependency order, handing outputs on", async () => {
    const workload = uniqueWorkload("graph");
    const workerId = await registerWorker(h, [workload], { maxConcurrency: 1000 });
    // split → 997 frames → encode, and a report after encode.
    const frames = 997;
    const specs: MessageInitShape<typeof CreateTaskRequestSchema>[] = [
      { workload, ref: "split", name: "split" },
      ...Array.from({ length: frames }, (_, i) => ({
        workload,
        ref: `frame-${i}`,
        name: `frame-${i}`,
        dependsOn: ["ref:split"],
      })),
      {
        workload,
        ref: "encode",
        name: "encode",
        dependsOn: Array.from({ length: frames }, (_, i) => `ref:frame-${i}`),
      },
      { workload, ref: "report", name: "report", dependsOn: ["ref:encode"] },
    ];
    const { tasks } = await h.tasks.createTasks({ tasks: specs });
    expect(tasks).toHaveLength(1000);
    const idOf = new Map(tasks.map((t) => [t.ref, t.taskId]));
    const byId = new Map(tasks.map((t) => [t.taskId, t]));
    expect(tasks[1]?.dependsOn).toEqual([idOf.get("split")]);
    expect(tasks[1]?.dependenciesPending).toBe(1);
    const waiting = await h.tasks.getTask({ taskId: idOf.get("encode") ?? "" });
    expect(waiting.waiting[0]).toMatchObject({
      kind: WaitKind.DEPENDENCIES,
      detail: { pending: BigInt(frames), total: BigInt(frames) },
    });

    const done = new Set<string>();
    const order: string[] = [];
    for (let round = 0; round < 50 && done.size < 1000; round++) {
      const { claims } = await h.leases.claimTasks({ workerId, maxTasks: 100 });
      for (const c of claims) {
        const task = byId.get(c.taskId);
        // Every dependency finished before the task could be claimed.
        for (const d of task?.dependsOn ?? []) expect(done.has(d)).toBe(true);
        if (task?.ref === "split") {
          const result = await upload(c, workerId, "scene.txt", "scene");
          await h.leases.completeTask({ ...leaseOf(c, workerId), result });
        } else if (task?.ref === "encode") {
          // The results of the frames that made one, by their refs.
          expect(Object.keys(c.dependencyOutputs).sort()).toEqual(
            Array.from({ length: 5 }, (_, i) => [`frame-${i}/frame.txt`, `frame-${i}/result`])
              .flat()
              .sort(),
          );
          await upload(c, workerId, "movie.txt", "movie");
          await h.leases.completeTask({ ...leaseOf(c, workerId) });
        } else if (task?.ref === "report") {
          // The encode step's output, by its ref and filename.
          expect(Object.keys(c.dependencyOutputs)).toEqual(["encode/movie.txt"]);
          await h.leases.completeTask({ ...leaseOf(c, workerId), resultValue: { ok: true } });
        } else {
          expect(c.dependencyOutputs["split/scene.txt"]).toBeDefined();
          expect(c.dependencyOutputs["split/result"]).toBe(c.dependencyOutputs["split/scene.txt"]);
          const { artifact } = await createClient(ArtifactService, h.transport).getArtifact({
            artifactId: c.dependencyOutputs["split/scene.txt"] ?? "",
          });
          expect(artifact?.taskId).toBe(idOf.get("split"));
          // Five frames make a result; the others finish without one.
          const n = Number((task?.ref ?? "").slice("frame-".length));
          const result = n < 5 ? await upload(c, workerId, "frame.txt", `${n}`) : undefined;
          await h.leases.completeTask({ ...leaseOf(c, workerId), result });
        }
        done.add(c.taskId);
        order.push(task?.ref ?? "");
      }
    }
    expect(done.size).toBe(1000);
    expect(order[0]).toBe("split");
    expect(order.slice(-2)).toEqual(["encode", "report"]);
    const { task: report } = await h.tasks.getTask({ taskId: idOf.get("report") ?? "" });
    expect(report).toMatchObject({ state: TaskState.SUCCEEDED, resultValue: { ok: true } });
  });

  it("fails the dependents of a failed task down the graph, runs ALL_DONE ones, and reruns them with rerun_dependents", async () => {
    const workload = uniqueWorkload("fail");
    const workerId = await registerWorker(h, [workload]);
    const { tasks } = await h.tasks.createTasks({
      tasks: [
        { workload, ref: "a", maxAttempts: 1 },
        { workload, ref: "b", dependsOn: ["ref:a"] },
        { workload, ref: "c", dependsOn: ["ref:b"] },
        {
          workload,
          ref: "cleanup",
          dependsOn: ["ref:a"],
          dependencyPolicy: DependencyPolicy.ALL_DONE,
        },
      ],
    });
    const [a, b, c, cleanup] = tasks.map((t) => t.taskId);
    const claim = await claimOne(h, workerId);
    expect(claim.taskId).toBe(a);
    await h.leases.failTask({ ...leaseOf(claim, workerId), errorCode: "Boom", retryable: false });
    const state = async (id = "") => (await h.tasks.getTask({ taskId: id })).task;
    expect(await state(b)).toMatchObject({
      state: TaskState.FAILED,
      error: { code: "DEPENDENCY_FAILED" },
    });
    expect((await state(c))?.state).toBe(TaskState.FAILED);
    // The ALL_DONE clean-up runs after a's failure.
    const next = await claimOne(h, workerId);
    expect(next.taskId).toBe(cleanup);
    await h.leases.completeTask(leaseOf(next, workerId));

    // A task made later on a failed dependency fails at once.
    const late = await h.tasks.createTask({ workload, dependsOn: [a ?? ""] });
    expect(late.task?.state).toBe(TaskState.FAILED);

    const { task: rerun } = await h.tasks.rerunTask({ taskId: a ?? "", rerunDependents: true });
    expect(rerun?.state).toBe(TaskState.PENDING);
    expect(await state(b)).toMatchObject({ state: TaskState.PENDING, dependenciesPending: 1 });
    expect(await state(c)).toMatchObject({ state: TaskState.PENDING, dependenciesPending: 1 });
    for (const expected of [a, b, c]) {
      const got = await claimOne(h, workerId);
      expect(got.taskId).toBe(expected);
      await h.leases.completeTask(leaseOf(got, workerId));
    }
    expect((await state(c))?.state).toBe(TaskState.SUCCEEDED);
  });

  it("reruns a failed graph of more than a page in one go, and RetryTask refuses a task its dependency failed", async () => {
    const workload = uniqueWorkload("bulk");
    const workerId = await registerWorker(h, [workload]);
    const { tasks } = await h.tasks.createTasks({
      tasks: [
        { workload, ref: "root", maxAttempts: 1 },
        ...Array.from({ length: 600 }, () => ({ workload, dependsOn: ["ref:root"] })),
      ],
    });
    const root = tasks[0]?.taskId ?? "";
    const claim = await claimOne(h, workerId);
    await h.leases.failTask({ ...leaseOf(claim, workerId), errorCode: "Boom", retryable: false });
    const child = tasks[1]?.taskId ?? "";
    const retried = await outcome(h.tasks.retryTask({ taskId: child }));
    expect(retried).toMatchObject({ code: "FailedPrecondition", reason: "INVALID_STATE" });

    const { count } = await h.tasks.rerunTasks({ filter: { workload } });
    expect(count).toBe(601);
    const { tasks: pending } = await h.tasks.listTasks({
      workload,
      state: TaskState.PENDING,
      pageSize: 1000,
    });
    expect(pending).toHaveLength(601);
    // The root runs first; its dependents wait for it.
    expect((await claimOne(h, workerId)).taskId).toBe(root);
    expect((await h.tasks.getTask({ taskId: child })).task?.dependenciesPending).toBe(1);
  });

  it("hands a pushed task its dependencies' outputs when its worker starts it", async () => {
    const workload = uniqueWorkload("push");
    const workerId = (
      await h.fleet.registerWorker({
        capabilities: [workload],
        maxConcurrency: 5,
        apiBaseUrl: "http://127.0.0.1:9/",
      })
    ).workerId;
    const { tasks } = await h.tasks.createTasks({
      tasks: [
        { workload, ref: "a" },
        { workload, ref: "b", dependsOn: ["ref:a"] },
      ],
    });
    const claim = await claimOne(h, workerId);
    const result = await upload(claim, workerId, "a.txt", "from a");
    await h.leases.completeTask({ ...leaseOf(claim, workerId), result });
    const { task: placed } = await h.tasks.scheduleTask({ taskId: tasks[1]?.taskId ?? "" });
    const { task: started } = await h.leases.startTask({
      taskId: placed?.taskId ?? "",
      workerId,
      attempt: placed?.attempt ?? 0,
      leaseToken: placed?.lease?.leaseToken ?? "",
    });
    expect(started?.dependencyOutputs["a/a.txt"]).toBe(result.artifactId);
  });

  it("takes a dependency's id in capitals, and the same task named twice once", async () => {
    const workload = uniqueWorkload();
    const { task: first } = await h.tasks.createTask({ workload, ref: "x" });
    const id = first?.taskId ?? "";
    const { task } = await h.tasks.createTask({ workload, dependsOn: [id.toUpperCase()] });
    expect(task).toMatchObject({ dependsOn: [id], dependenciesPending: 1 });
    const twice = await outcome(
      h.tasks.createTask({ workload, dependsOn: [id, id.toUpperCase()] }),
    );
    expect(twice).toMatchObject({ code: "InvalidArgument" });
  });

  it("refuses cycles, unknown references and unknown ids, creating nothing", async () => {
    const workload = uniqueWorkload();
    const cases: MessageInitShape<typeof CreateTaskRequestSchema>[][] = [
      [
        { workload, ref: "x", dependsOn: ["ref:y"] },
        { workload, ref: "y", dependsOn: ["ref:x"] },
      ],
      [{ workload, ref: "x", dependsOn: ["ref:x"] }],
      [{ workload, dependsOn: ["ref:nowhere"] }],
      [{ workload, dependsOn: ["4c7a6a0e-0000-4000-8000-000000000000"] }],
      [{ workload, dependsOn: ["not a task"] }],
      [
        { workload, ref: "x" },
        { workload, ref: "x" },
      ],
    ];
    for (const tasks of cases) {
      const got = await outcome(h.tasks.createTasks({ tasks }));
      expect(got, JSON.stringify(tasks)).toMatchObject({ code: "InvalidArgument" });
    }
    expect((await h.tasks.listTasks({ workload })).tasks).toEqual([]);
  });
});

describe("execution timeout", () => {
  it("fails an attempt that runs past timeout_seconds with TIMEOUT, retries it, and cancels the holder's stream", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    const { task } = await h.tasks.createTask({
      workload,
      timeoutSeconds: 1,
      maxAttempts: 2,
      retryBackoff: { initial: durationFromMs(0), max: durationFromMs(0), multiplier: 1 },
    });
    const claim = await claimOne(h, workerId);
    expect(claim.timeoutSeconds).toBe(1);
    // Renewals do not extend the bound.
    await h.leases.renewLease(leaseOf(claim, workerId));
    await waitUntil(async () => {
      await h.app.sweeper.runOnce();
      const { task: t } = await h.tasks.getTask({ taskId: task?.taskId ?? "" });
      return t?.state === TaskState.PENDING;
    }, "the timeout");
    const { task: timedOut } = await h.tasks.getTask({ taskId: task?.taskId ?? "" });
    expect(timedOut?.error?.code).toBe("TIMEOUT");
    const renew = await outcome(h.leases.renewLease(leaseOf(claim, workerId)));
    expect(renew).toMatchObject({ code: "Aborted", reason: "TIMEOUT" });
    async function* beat() {
      yield { workerId, leases: [{ ...leaseOf(claim, workerId) }] };
    }
    for await (const res of h.leases.streamLeases(beat())) {
      expect(res.leases[0]).toMatchObject({ status: 3, reason: "TIMEOUT" });
    }
    // The second attempt times out too: out of attempts, FAILED.
    const second = await claimOne(h, workerId);
    expect(second.attempt).toBe(2);
    await waitUntil(async () => {
      await h.app.sweeper.runOnce();
      const { task: t } = await h.tasks.getTask({ taskId: task?.taskId ?? "" });
      return t?.state === TaskState.FAILED;
    }, "the second timeout");
  });
});

describe("result values", () => {
  it("keeps a completion's result_value and refuses one over 64 KiB", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    await h.tasks.createTask({ workload });
    const claim = await claimOne(h, workerId);
    const big = await outcome(
      h.leases.completeTask({
        ...leaseOf(claim, workerId),
        resultValue: { s: "x".repeat(70_000) },
      }),
    );
    expect(big).toMatchObject({ code: "InvalidArgument" });
    const value = { hits: 3, best: { id: "P12345", score: 0.97 }, tags: ["a", "b"] };
    const { task } = await h.leases.completeTask({
      ...leaseOf(claim, workerId),
      resultValue: value,
    });
    expect(task?.resultValue).toEqual(value);
    const again = await h.leases.completeTask({ ...leaseOf(claim, workerId), resultValue: value });
    expect(again.task?.resultValue).toEqual(value);
    const other = await outcome(
      h.leases.completeTask({ ...leaseOf(claim, workerId), resultValue: { hits: 4 } }),
    );
    expect(other).toMatchObject({ code: "AlreadyExists", reason: "COMPLETION_CONFLICT" });
  });
});
