import {
  Code,
  ConnectError,
  createClient as createRpcClient,
  type Interceptor,
} from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { transportFor } from "../../src/cli/connect.js";
import {
  createClient,
  type MeshworkClient,
  TaskFailedError,
  TaskState,
  TaskWaitTimeoutError,
} from "../../src/client/index.js";
import { createWorker, TaskError, type Worker } from "../../src/sdk/worker.js";
import { listen, type RunningServer } from "../../src/server.js";
import { within } from "../support/bounded.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { appOn, claimOne, registerWorker, uniqueWorkload } from "../support/harness.js";

// The client SDK (src/client, `meshwork/client`) from its TypeScript source,
// against a real coordinator with auth on, listening on port 0, with a
// client token; tasks are run by the worker SDK.

describe("the client SDK against a coordinator with auth on", () => {
  let tdb: TestDatabase;
  let server: RunningServer | undefined;
  let clientToken = "";
  let workerToken = "";
  const workers: Worker[] = [];

  beforeAll(async () => {
    tdb = await createTestDatabase();
    const app = appOn(tdb.database, { auth: "on" });
    clientToken = (await app.tokens.create("client-sdk", "client")).secret;
    workerToken = (await app.tokens.create("client-sdk-worker", "worker")).secret;
    server = await listen(app, "127.0.0.1:0");
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop().catch(() => {})));
    await server?.close();
    await tdb.drop();
  });

  const url = () => {
    if (!server) throw new Error("the server starts in beforeAll");
    return server.url;
  };
  const client = (options: Partial<Parameters<typeof createClient>[0]> = {}): MeshworkClient =>
    createClient({ baseUrl: url(), token: clientToken, ...options });

  /**
   * A worker for `workload`: it completes a task with `{ summary: "ok <n>" }`
   * for parameters `{ n }`, and fails it with `{ fail: "CODE" }`.
   */
  function worker(workload: string): Worker {
    const w = createWorker({
      url: url(),
      token: workerToken,
      workloads: [workload],
      concurrency: 4,
      pollSeconds: 2,
      installSignalHandlers: false,
      log: () => {},
      async handler(task, ctx) {
        const p = task.parameters as { n?: number; fail?: string; lines?: string[] };
        for (const line of p.lines ?? []) ctx.log(line);
        if (p.fail)
          throw new TaskError(p.fail, `asked to fail with ${p.fail}`, { retryable: false });
        return { summary: `ok ${p.n}`, metrics: { n: p.n ?? 0 } };
      },
    });
    workers.push(w);
    return w;
  }

  /** An interceptor counting the tries of each method, failing some with `fail(method, try)`. */
  function tries(fail: (method: string, n: number) => ConnectError | undefined = () => undefined) {
    const count = new Map<string, number>();
    const interceptor: Interceptor = (next) => async (req) => {
      const n = (count.get(req.method.name) ?? 0) + 1;
      count.set(req.method.name, n);
      const error = fail(req.method.name, n);
      if (error) throw error;
      return next(req);
    };
    return { count, interceptor };
  }

  it("creates one task with typed parameters and a generated idempotency key; the same explicit key returns the same task", async () => {
    const c = client();
    const workload = uniqueWorkload("one");
    const task = await c.tasks.create<{ frame: number; scene: string }>(
      workload,
      { frame: 7, scene: "a" },
      { name: "frame 7", priority: 3, maxAttempts: 2 },
    );
    expect(task).toMatchObject({
      workload,
      name: "frame 7",
      priority: 3,
      maxAttempts: 2,
      state: TaskState.PENDING,
      parameters: { frame: 7, scene: "a" },
    });
    expect(task.idempotencyKey).toMatch(/^[0-9a-f-]{36}$/);
    // A second create without a key is a second task.
    const other = await c.tasks.create(workload, { frame: 7, scene: "a" });
    expect(other.taskId).not.toBe(task.taskId);

    const first = await c.tasks.create(workload, { frame: 8 }, { idempotencyKey: "order-8" });
    const again = await c.tasks.create(workload, { frame: 8 }, { idempotencyKey: "order-8" });
    expect(again.taskId).toBe(first.taskId);
    // The same key for another request is refused, not retried.
    const reused = await c.tasks
      .create(workload, { frame: 9 }, { idempotencyKey: "order-8" })
      .catch((e: unknown) => e);
    expect(reused).toBeInstanceOf(ConnectError);
    expect((reused as ConnectError).code).toBe(Code.AlreadyExists);
    // No key at all when asked.
    const unkeyed = await c.tasks.create(workload, {}, { idempotencyKey: false });
    expect(unkeyed.idempotencyKey).toBe("");
  });

  it("creates many tasks in order; the same explicit keys return the same tasks", async () => {
    const c = client();
    const workload = uniqueWorkload("many");
    const specs = [1, 2, 3].map((n) => ({
      workload,
      params: { n },
      idempotencyKey: `${workload}-${n}`,
    }));
    const tasks = await c.tasks.createMany(specs);
    expect(tasks.map((t) => t.parameters)).toEqual([{ n: 1 }, { n: 2 }, { n: 3 }]);
    const again = await c.tasks.createMany(specs);
    expect(again.map((t) => t.taskId)).toEqual(tasks.map((t) => t.taskId));
    // Keys are made per task by default.
    const fresh = await c.tasks.createMany([{ workload }, { workload }]);
    expect(new Set(fresh.map((t) => t.idempotencyKey)).size).toBe(2);
  });

  it("creates a graph in one call: refs, dependencies, a delay and a timeout", async () => {
    const c = client();
    const workload = uniqueWorkload("graph");
    const [first, second, later] = await c.tasks.createMany([
      { workload, params: { n: 1 }, ref: "first" },
      {
        workload,
        params: { n: 2 },
        ref: "second",
        dependsOn: ["ref:first"],
        dependencyPolicy: "allDone",
        timeoutSeconds: 60,
      },
      { workload, params: { n: 3 }, delaySeconds: 3600 },
    ]);
    expect(first).toMatchObject({ ref: "first", dependsOn: [] });
    expect(second).toMatchObject({
      ref: "second",
      dependsOn: [first?.taskId],
      dependenciesPending: 1,
      timeoutSeconds: 60,
    });
    expect(later?.runAt).toBeDefined();
    worker(workload);
    expect((await c.tasks.result(second ?? "", { timeoutMs: 20_000 })).summary).toBe("ok 2");
    expect((await c.tasks.get(first ?? "")).state).toBe(TaskState.SUCCEEDED);
    expect((await c.tasks.get(later ?? "")).state).toBe(TaskState.PENDING);
    await c.tasks.cancel(later ?? "");
  });

  it("awaits a result: SUCCEEDED resolves with the outcome, FAILED rejects with the task's error code", async () => {
    const c = client();
    const workload = uniqueWorkload("result");
    worker(workload);
    const task = await c.tasks.create(workload, { n: 5 });
    const outcome = await c.tasks.result(task, { timeoutMs: 20_000 });
    expect(outcome).toMatchObject({ taskId: task.taskId, summary: "ok 5", metrics: { n: 5 } });
    expect(outcome.task.state).toBe(TaskState.SUCCEEDED);

    // run(): create, then wait.
    expect((await c.tasks.run(workload, { n: 6 }, { timeoutMs: 20_000 })).summary).toBe("ok 6");

    const failing = await c.tasks.create(workload, { fail: "BAD_INPUT" });
    const error = await c.tasks.result(failing.taskId, { timeoutMs: 20_000 }).catch((e) => e);
    expect(error).toBeInstanceOf(TaskFailedError);
    expect(error).toMatchObject({
      taskId: failing.taskId,
      state: TaskState.FAILED,
      code: "BAD_INPUT",
      canceled: false,
    });
    expect((error as TaskFailedError).message).toContain("asked to fail with BAD_INPUT");
  });

  it("resolves with the result value a completion carried, as plain JSON", async () => {
    const c = client();
    const workload = uniqueWorkload("value");
    // A worker by hand: the raw RPCs, completing with a result_value.
    const transport = transportFor({ url: url(), token: workerToken });
    const raw = {
      fleet: createRpcClient(FleetService, transport),
      leases: createRpcClient(LeaseService, transport),
    };
    const workerId = await registerWorker(raw, [workload]);
    const task = await c.tasks.create(workload, { n: 2 });
    const claim = await claimOne(raw, workerId);
    const value = { hits: [{ id: "a", score: 0.5 }], total: 1, exact: true, note: null };
    await raw.leases.completeTask({
      taskId: claim.taskId,
      workerId,
      attempt: claim.attempt,
      leaseToken: claim.leaseToken,
      resultValue: value,
    });
    const outcome = await c.tasks.result<typeof value>(task, { timeoutMs: 20_000 });
    expect(outcome.value).toEqual(value);
  });

  it("gives up waiting on a timeout or an abort, promptly, and leaves the task alone", async () => {
    const c = client();
    const workload = uniqueWorkload("nobody"); // no worker runs it
    const task = await c.tasks.create(workload, {});

    const timedOut = await within(
      10_000,
      c.tasks.result(task, { timeoutMs: 300 }).catch((e) => e),
    );
    expect(timedOut).toBeInstanceOf(TaskWaitTimeoutError);
    expect(timedOut).toMatchObject({ taskId: task.taskId, timeoutMs: 300 });
    expect((timedOut as TaskWaitTimeoutError).task?.state).toBe(TaskState.PENDING);

    const abort = new AbortController();
    const waiting = c.tasks.result(task, { signal: abort.signal }).catch((e) => e);
    setTimeout(() => abort.abort(new Error("no longer needed")), 200);
    const aborted = await within(10_000, waiting);
    expect(aborted).toBeInstanceOf(Error);
    expect((aborted as Error).message).toBe("no longer needed");
    // An already aborted signal rejects at once.
    await expect(c.tasks.result(task, { signal: AbortSignal.abort() })).rejects.toThrow();

    expect((await c.tasks.get(task)).state).toBe(TaskState.PENDING);
  });

  it("cancels a task, which its waiter sees; reruns it, which a worker then runs", async () => {
    const c = client();
    const workload = uniqueWorkload("cancel");
    const task = await c.tasks.create(workload, { n: 1 });
    const waiting = c.tasks.result(task, { timeoutMs: 20_000 }).catch((e) => e);
    const canceled = await c.tasks.cancel(task, { reason: "changed my mind" });
    expect(canceled.state).toBe(TaskState.CANCELED);
    const error = await waiting;
    expect(error).toBeInstanceOf(TaskFailedError);
    expect((error as TaskFailedError).canceled).toBe(true);
    // Cancelling a finished task is refused, and not retried.
    await expect(c.tasks.cancel(task)).rejects.toMatchObject({ code: Code.FailedPrecondition });

    const rerun = await c.tasks.rerun(task.taskId);
    expect(rerun).toMatchObject({ taskId: task.taskId, state: TaskState.PENDING });
    worker(workload);
    expect((await c.tasks.result(task, { timeoutMs: 20_000 })).summary).toBe("ok 1");
  });

  it("lists every task page by page, and cancels and reruns many by a selector", async () => {
    const c = client();
    const workload = uniqueWorkload("list");
    const created = await c.tasks.createMany(
      [1, 2, 3, 4, 5].map((n) => ({ workload, params: { n } })),
    );
    const listed = [];
    for await (const t of c.tasks.list({ workload, pageSize: 2 })) listed.push(t.taskId);
    // Newest first.
    expect(listed.sort()).toEqual(created.map((t) => t.taskId).sort());
    const pending = [];
    for await (const t of c.tasks.list({ workload, state: "PENDING" })) pending.push(t);
    expect(pending).toHaveLength(5);

    expect(await c.tasks.cancelMany({ workload }, { dryRun: true })).toBe(5);
    expect(await c.tasks.cancelMany({ workload, taskIds: [created[0]?.taskId ?? ""] })).toBe(1);
    expect(await c.tasks.cancelMany({ workload }, { reason: "cleanup" })).toBe(4);
    expect(await c.tasks.rerunMany({ workload, states: ["CANCELED"] })).toBe(5);
    const states = [];
    for await (const t of c.tasks.list({ workload })) states.push(t.state);
    expect(states).toEqual(Array(5).fill(TaskState.PENDING));

    const events = [];
    for await (const e of c.tasks.events(created[0] ?? "")) events.push(e.state);
    expect(events).toEqual([TaskState.PENDING, TaskState.CANCELED, TaskState.PENDING]);
  });

  it("retries a call answered unavailable, and a create so retried makes one task", async () => {
    const workload = uniqueWorkload("retry");
    const t = tries((method, n) =>
      method === "CreateTask" && n <= 2 ? new ConnectError("down", Code.Unavailable) : undefined,
    );
    const c = client({ interceptors: [t.interceptor], retry: { initialDelayMs: 10 } });
    await c.tasks.create(workload, { n: 1 });
    expect(t.count.get("CreateTask")).toBe(3);

    // The coordinator created the task, but its answer was lost: the retry,
    // with the same idempotency key, gets the same task.
    let lost = 0;
    const losing: Interceptor = (next) => async (req) => {
      const res = await next(req);
      if (req.method.name === "CreateTask" && lost++ === 0) {
        throw new ConnectError("connection lost", Code.Unavailable);
      }
      return res;
    };
    const created = await client({
      interceptors: [losing],
      retry: { initialDelayMs: 10 },
    }).tasks.create(workload, { n: 2 });
    expect(lost).toBe(2);
    const all = [];
    for await (const task of client().tasks.list({ workload })) all.push(task.taskId);
    expect(all).toHaveLength(2);
    expect(all).toContain(created.taskId);

    // Bounded: maxAttempts tries, then the error.
    const down = tries(() => new ConnectError("down", Code.Unavailable));
    const bounded = client({
      interceptors: [down.interceptor],
      retry: { maxAttempts: 3, initialDelayMs: 10 },
    });
    await expect(bounded.tasks.get("00000000-0000-4000-8000-000000000000")).rejects.toMatchObject({
      code: Code.Unavailable,
    });
    expect(down.count.get("GetTask")).toBe(3);
  });

  it("does not retry any other code", async () => {
    const invalid = tries((method, n) =>
      n === 1 ? new ConnectError(`bad ${method}`, Code.InvalidArgument) : undefined,
    );
    const c = client({ interceptors: [invalid.interceptor], retry: { initialDelayMs: 10 } });
    await expect(c.tasks.create(uniqueWorkload("invalid"), {})).rejects.toMatchObject({
      code: Code.InvalidArgument,
    });
    expect(invalid.count.get("CreateTask")).toBe(1);
    // A refusal of the coordinator itself: not_found, once.
    const counted = tries();
    const c2 = client({ interceptors: [counted.interceptor] });
    await expect(c2.tasks.get("00000000-0000-4000-8000-000000000000")).rejects.toMatchObject({
      code: Code.NotFound,
    });
    expect(counted.count.get("GetTask")).toBe(1);
    await expect(
      c2.tasks.result("00000000-0000-4000-8000-000000000000", { timeoutMs: 10_000 }),
    ).rejects.toMatchObject({ code: Code.NotFound });
    expect(counted.count.get("WatchTask")).toBe(1);
  });

  it("reopens a result's watch that broke with unavailable", async () => {
    const workload = uniqueWorkload("rewatch");
    const t = tries((method, n) =>
      method === "WatchTask" && n <= 2 ? new ConnectError("down", Code.Unavailable) : undefined,
    );
    const c = client({ interceptors: [t.interceptor], retry: { initialDelayMs: 10 } });
    const task = await c.tasks.create(workload, { n: 3 });
    worker(workload);
    expect((await c.tasks.result(task, { timeoutMs: 20_000 })).summary).toBe("ok 3");
    expect(t.count.get("WatchTask")).toBeGreaterThanOrEqual(3);
  });

  it("sends a traceparent on every call, which the task keeps, and the correlation id", async () => {
    const sent: string[] = [];
    const recording: Interceptor = (next) => (req) => {
      sent.push(req.header.get("traceparent") ?? "");
      return next(req);
    };
    const c = client({ interceptors: [recording], correlationId: "batch-42" });
    const task = await c.tasks.create(uniqueWorkload("trace"), {});
    const [traceparent] = sent;
    expect(traceparent).toMatch(/^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
    const traceId = traceparent?.split("-")[1];
    // The coordinator keeps the caller's trace id, under its own span.
    expect(task.traceparent.split("-")[1]).toBe(traceId);
    expect(task.correlationId).toBe("batch-42");
    // A new trace per call.
    await c.tasks.get(task);
    expect(sent[1]?.split("-")[1]).not.toBe(traceId);
    // A call's own headers win.
    const mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const own = await c.tasks.create(
      uniqueWorkload("trace"),
      {},
      {
        headers: { traceparent: mine, "x-correlation-id": "mine" },
      },
    );
    expect(own.traceparent.split("-")[1]).toBe("0af7651916cd43dd8448eb211c80319c");
    expect(own.correlationId).toBe("mine");
  });

  it("works over gRPC too", async () => {
    const c = client({ transport: "grpc" });
    const workload = uniqueWorkload("grpc");
    worker(workload);
    const outcome = await c.tasks.run(workload, { n: 9 }, { timeoutMs: 20_000 });
    expect(outcome.summary).toBe("ok 9");
  });

  it("creates, reads, lists, pauses, resumes, triggers and deletes a schedule", async () => {
    const c = client();
    const workload = uniqueWorkload("cron");
    const name = `${workload}-nightly`;
    const schedule = await c.schedules.create<{ n: number }>({
      name,
      cron: "0 3 * * *",
      timeZone: "Europe/Paris",
      task: { workload, params: { n: 11 }, maxAttempts: 1 },
      overlap: "allow",
      catchUp: "skip",
    });
    expect(schedule).toMatchObject({
      name,
      cron: "0 3 * * *",
      timeZone: "Europe/Paris",
      paused: false,
    });
    expect(schedule.template).toMatchObject({ workload, parameters: { n: 11 }, maxAttempts: 1 });
    expect(schedule.nextRunAt).toBeDefined();
    // By id or by name.
    expect((await c.schedules.get(name)).scheduleId).toBe(schedule.scheduleId);
    const names = [];
    for await (const s of c.schedules.list({ pageSize: 1 })) names.push(s.name);
    expect(names).toContain(name);

    expect((await c.schedules.pause(schedule.scheduleId)).paused).toBe(true);
    const resumed = await c.schedules.resume(name);
    expect(resumed.paused).toBe(false);
    expect(resumed.nextRunAt).toBeDefined();

    worker(workload);
    const task = await c.schedules.trigger(name);
    expect(task).toMatchObject({
      workload,
      scheduleId: schedule.scheduleId,
      parameters: { n: 11 },
    });
    expect((await c.tasks.result(task, { timeoutMs: 20_000 })).summary).toBe("ok 11");

    await c.schedules.delete(name);
    await expect(c.schedules.get(name)).rejects.toMatchObject({ code: Code.NotFound });
  });

  it("reads a task's log lines, and follows them until the task finished", async () => {
    const c = client();
    const workload = uniqueWorkload("logs");
    const task = await c.tasks.create(workload, { n: 1, lines: ["one", "two", "three"] });
    const following = (async () => {
      const seen = [];
      for await (const line of c.tasks.followLogs(task)) seen.push(line.text);
      return seen;
    })();
    worker(workload);
    await c.tasks.result(task, { timeoutMs: 20_000 });
    expect(await within(20_000, following)).toEqual(["one", "two", "three"]);
    const lines = [];
    for await (const line of c.tasks.logs(task, { pageSize: 2 })) lines.push(line);
    expect(lines.map((l) => l.text)).toEqual(["one", "two", "three"]);
    expect(lines.map((l) => l.attempt)).toEqual([1, 1, 1]);
    // From a sequence on.
    const rest = [];
    for await (const line of c.tasks.logs(task, { afterSequence: lines[0]?.sequence }))
      rest.push(line.text);
    expect(rest).toEqual(["two", "three"]);
  });

  it("refuses a URL without a scheme, saying what to write", () => {
    expect(() => createClient({ baseUrl: "127.0.0.1:8080" })).toThrow(
      /try "http:\/\/127.0.0.1:8080"/,
    );
  });
});
