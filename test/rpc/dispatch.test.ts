import { createHmac } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeliveryState, TaskState, WaitKind } from "../../gen/meshwork/v1/task_pb.js";
import { rowsOf } from "../../src/db/values.js";
import { outcome } from "../support/errors.js";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

// The coordinator delivers a placed task with dispatch to its worker
// (SPEC §14): a local HTTP server on 127.0.0.1 plays the worker. The
// dispatcher does not run on its own here: each test calls runOnce().

interface Received {
  headers: IncomingMessage["headers"];
  body: string;
  url: string;
}

interface FakeWorker {
  url: string;
  received: Received[];
  close(): Promise<void>;
}

/** A worker's HTTP server answering each dispatch with `answer` (null: never answers). */
async function fakeWorker(answer: (n: number) => number | null): Promise<FakeWorker> {
  const received: Received[] = [];
  const hanging: ServerResponse[] = [];
  const server: Server = createServer((req, res) => {
    let body = "";
    req.on("data", (c: Buffer) => {
      body += c.toString("utf8");
    });
    req.on("end", () => {
      received.push({ headers: req.headers, body, url: req.url ?? "" });
      const status = answer(received.length);
      if (status === null) hanging.push(res);
      else res.writeHead(status, { "content-type": "text/plain" }).end(`answer ${status}`);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    received,
    close: () =>
      new Promise<void>((resolve) => {
        for (const r of hanging) r.destroy();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A port nothing listens on. */
async function closedPort(): Promise<string> {
  const w = await fakeWorker(() => 200);
  await w.close();
  return w.url;
}

const secret = `${"s".repeat(20)}-a-dispatch-secret-0123456789`;

let h: Harness;
const servers: FakeWorker[] = [];
beforeAll(async () => {
  // Short enough that a worker that never answers costs the suite little,
  // long enough that one that does is heard on a loaded CI machine.
  h = await createHarness({ dispatchTimeoutMs: 1000 });
});
afterAll(async () => {
  for (const s of servers) await s.close();
  await h.close();
});

async function serve(answer: (n: number) => number | null): Promise<FakeWorker> {
  const w = await fakeWorker(answer);
  servers.push(w);
  return w;
}

async function worker(workload: string, url: string, extra: Record<string, unknown> = {}) {
  const { workerId } = await h.fleet.registerWorker({
    name: `w-${url}`,
    capabilities: [workload],
    apiBaseUrl: url,
    maxConcurrency: 1,
    dispatchSecret: secret,
    ...extra,
  });
  return workerId;
}

async function placedTask(workload: string, extra: Record<string, unknown> = {}) {
  const { task } = await h.tasks.createTask({
    workload,
    dispatch: true,
    parameters: { n: 1 },
    correlationId: "corr-dispatch",
    ...extra,
  });
  const { task: placed } = await h.tasks.scheduleTask({ taskId: task?.taskId ?? "" });
  return placed;
}

const history = async (taskId: string) =>
  (await h.tasks.listTaskEvents({ taskId, pageSize: 100 })).events
    .filter((e) => e.kind === "dispatch")
    .map((e) => ({
      outcome: e.dispatch?.outcome,
      status: e.dispatch?.httpStatus,
      worker: e.workerId,
    }));

describe("dispatch", () => {
  it("delivers a placed task once, with the body, headers and a valid signature", async () => {
    const w = uniqueWorkload();
    const server = await serve(() => 202);
    const workerId = await worker(w, server.url, { dispatchPath: "/hooks/meshwork" });
    const placed = await placedTask(w);
    expect(placed?.delivery?.state).toBe(DeliveryState.DELIVERING);
    const waiting = await h.tasks.getTask({ taskId: placed?.taskId ?? "" });
    expect(waiting.waiting.map((r) => r.kind)).toEqual([WaitKind.DELIVERING]);
    await h.app.dispatcher.runOnce();
    await h.app.dispatcher.runOnce();
    expect(server.received).toHaveLength(1);
    const [got] = server.received;
    expect(got?.url).toBe("/hooks/meshwork");
    const body = JSON.parse(got?.body ?? "{}");
    expect(Object.keys(body)).toEqual([
      "taskId",
      "attempt",
      "leaseToken",
      "leaseExpiresAt",
      "workload",
      "parameters",
      "input",
      "correlationId",
      "traceparent",
      "coordinatorUrl",
    ]);
    expect(body).toMatchObject({
      taskId: placed?.taskId,
      attempt: 1,
      leaseToken: placed?.lease?.leaseToken,
      workload: w,
      parameters: { n: 1 },
      input: null,
      correlationId: "corr-dispatch",
      coordinatorUrl: "http://127.0.0.1:8080",
    });
    expect(got?.headers["content-type"]).toBe("application/json");
    expect(got?.headers["x-correlation-id"]).toBe("corr-dispatch");
    expect(got?.headers.authorization).toBeUndefined();
    const sig = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(String(got?.headers["x-meshwork-signature"]));
    expect(sig).not.toBeNull();
    const expected = createHmac("sha256", secret).update(`${sig?.[1]}.${got?.body}`).digest("hex");
    expect(sig?.[2]).toBe(expected);
    const { task, waiting: after } = await h.tasks.getTask({ taskId: placed?.taskId ?? "" });
    expect(task?.state).toBe(TaskState.ASSIGNED);
    expect(task?.delivery).toMatchObject({
      state: DeliveryState.ACCEPTED,
      workerId,
      attempt: 1,
      tries: 1,
      lastStatus: 202,
    });
    expect(after).toEqual([]);
    expect(await history(placed?.taskId ?? "")).toEqual([
      { outcome: "accepted", status: 202, worker: workerId },
    ]);
    const metrics = await h.app.metrics.scrape();
    expect(metrics).toMatch(/meshwork_dispatches_total\{outcome="accepted"\} [1-9]/);
    expect(metrics).toMatch(/meshwork_dispatch_duration_seconds_count\{outcome="accepted"\} [1-9]/);
  });

  it("never writes a password of the worker's URL into the history", async () => {
    const w = uniqueWorkload();
    const taking = await serve(() => 200);
    const url = new URL(taking.url);
    url.username = "lab";
    url.password = "hunter2";
    await worker(w, url.toString());
    const placed = await placedTask(w);
    await h.app.dispatcher.runOnce();
    expect(taking.received).toHaveLength(1);
    const { events } = await h.tasks.listTaskEvents({ taskId: placed?.taskId ?? "" });
    const sent = events.find((e) => e.kind === "dispatch")?.dispatch;
    expect(sent?.outcome).toBe("accepted");
    expect(sent?.url).not.toContain("hunter2");
  });

  it("takes a 409 as accepted: the worker has it", async () => {
    const w = uniqueWorkload();
    const server = await serve(() => 409);
    await worker(w, server.url);
    const placed = await placedTask(w);
    await h.app.dispatcher.runOnce();
    const { task } = await h.tasks.getTask({ taskId: placed?.taskId ?? "" });
    expect(task?.delivery?.state).toBe(DeliveryState.ACCEPTED);
    expect((await history(task?.taskId ?? ""))[0]?.outcome).toBe("duplicate");
  });

  it("places a refused task on another worker, the refusal in its history", async () => {
    const w = uniqueWorkload();
    const refusing = await serve(() => 403);
    const taking = await serve(() => 200);
    // The refusing worker has more free slots: placement picks it first.
    const a = await worker(w, refusing.url, { maxConcurrency: 2 });
    const b = await worker(w, taking.url);
    const placed = await placedTask(w, { maxAttempts: 2 });
    expect(placed?.assignedWorkerId).toBe(a);
    await h.app.dispatcher.runOnce();
    await h.app.dispatcher.runOnce();
    expect(refusing.received).toHaveLength(1);
    expect(taking.received).toHaveLength(1);
    const { task } = await h.tasks.getTask({ taskId: placed?.taskId ?? "" });
    expect(task).toMatchObject({ state: TaskState.ASSIGNED, attempt: 2, assignedWorkerId: b });
    expect(task?.delivery).toMatchObject({
      state: DeliveryState.ACCEPTED,
      attempt: 2,
      workerId: b,
    });
    expect(await history(task?.taskId ?? "")).toEqual([
      { outcome: "refused", status: 403, worker: a },
      { outcome: "accepted", status: 200, worker: b },
    ]);
    // The first attempt's lease is fenced: its worker cannot start it.
    const old = JSON.parse(refusing.received[0]?.body ?? "{}");
    expect(
      await outcome(
        h.leases.startTask({
          taskId: old.taskId,
          workerId: a,
          attempt: 1,
          leaseToken: old.leaseToken,
        }),
      ),
    ).toMatchObject({ code: "Aborted" });
    // The refused attempt was never run: it does not count against
    // max_attempts (2), so a failure of the attempt that ran is retried.
    const sent = JSON.parse(taking.received[0]?.body ?? "{}");
    const lease = { taskId: sent.taskId, workerId: b, attempt: 2, leaseToken: sent.leaseToken };
    await h.leases.startTask(lease);
    const { task: failed } = await h.leases.failTask({
      ...lease,
      errorCode: "Flaky",
      retryable: true,
    });
    expect(failed?.state).toBe(TaskState.PENDING);
  });

  for (const [why, expected] of [
    ["is down", "unreachable"],
    ["never answers", "timeout"],
  ] as const) {
    it(`retries a worker that ${why}, then places the task elsewhere`, async () => {
      const w = uniqueWorkload();
      const bad = why === "is down" ? await closedPort() : (await serve(() => null)).url;
      const good = await serve(() => 200);
      const a = await worker(w, bad, { maxConcurrency: 2 });
      const b = await worker(w, good.url);
      const placed = await placedTask(w);
      const taskId = placed?.taskId ?? "";
      expect(placed?.assignedWorkerId).toBe(a);
      await h.app.dispatcher.runOnce();
      let got = await h.tasks.getTask({ taskId });
      expect(got.task?.delivery).toMatchObject({ state: DeliveryState.DELIVERING, tries: 1 });
      expect(got.waiting.map((r) => r.kind)).toEqual([WaitKind.DELIVERING]);
      // Due again now.
      await h.app.database.db.execute(
        sql`update deliveries set next_at = now() where task_id = ${taskId}::uuid`,
      );
      await h.app.dispatcher.runOnce();
      expect((await h.tasks.getTask({ taskId })).task?.delivery?.tries).toBe(2);
      // Due again now, with the lease ending before the next backoff (4 s),
      // though after this try's timeout: the last try.
      await h.app.database.db.execute(
        sql`update tasks set lease_expires_at = now() + interval '3 seconds' where id = ${taskId}::uuid`,
      );
      await h.app.database.db.execute(
        sql`update deliveries set next_at = now() where task_id = ${taskId}::uuid`,
      );
      await h.app.dispatcher.runOnce();
      await h.app.dispatcher.runOnce();
      got = await h.tasks.getTask({ taskId });
      expect(got.task).toMatchObject({
        state: TaskState.ASSIGNED,
        attempt: 2,
        assignedWorkerId: b,
      });
      expect(got.task?.delivery?.state).toBe(DeliveryState.ACCEPTED);
      expect(good.received).toHaveLength(1);
      expect((await history(taskId)).map((e) => [e.outcome, e.worker])).toEqual([
        [expected, a],
        [expected, a],
        [expected, a],
        ["accepted", b],
      ]);
      const events = (await h.tasks.listTaskEvents({ taskId, pageSize: 100 })).events;
      expect(events.find((e) => e.kind === "dispatch")?.dispatch?.error).not.toBe("");
    });
  }

  it("tries a busy worker (429) again rather than placing the task elsewhere", async () => {
    const w = uniqueWorkload();
    let busy = true;
    const one = await serve(() => (busy ? 429 : 202));
    const other = await serve(() => 200);
    const a = await worker(w, one.url, { maxConcurrency: 2 });
    await worker(w, other.url);
    const placed = await placedTask(w);
    const taskId = placed?.taskId ?? "";
    expect(placed?.assignedWorkerId).toBe(a);
    await h.app.dispatcher.runOnce();
    expect((await h.tasks.getTask({ taskId })).task?.delivery).toMatchObject({
      state: DeliveryState.DELIVERING,
      lastStatus: 429,
    });
    busy = false;
    await h.app.database.db.execute(
      sql`update deliveries set next_at = now() where task_id = ${taskId}::uuid`,
    );
    await h.app.dispatcher.runOnce();
    const { task } = await h.tasks.getTask({ taskId });
    expect(task).toMatchObject({ attempt: 1, assignedWorkerId: a });
    expect(task?.delivery?.state).toBe(DeliveryState.ACCEPTED);
    expect(other.received).toHaveLength(0);
  });

  it("never sends a stale attempt: placed again before the dispatcher ran, only the new one goes", async () => {
    const w = uniqueWorkload();
    const one = await serve(() => 200);
    const two = await serve(() => 200);
    await worker(w, one.url, { maxConcurrency: 2 });
    await worker(w, two.url);
    const placed = await placedTask(w);
    await h.tasks.retryTask({ taskId: placed?.taskId ?? "" });
    await h.app.dispatcher.runOnce();
    expect(one.received).toHaveLength(0);
    expect(two.received.map((r) => JSON.parse(r.body).attempt)).toEqual([2]);
  });

  it("refuses a literal private address at registration, and a name resolving to one at dispatch", async () => {
    const w = uniqueWorkload();
    const secret = "s".repeat(32);
    expect(
      await outcome(
        h.fleet.registerWorker({
          name: "ten",
          capabilities: [w],
          apiBaseUrl: "http://10.1.2.3:8080",
          dispatchSecret: secret,
        }),
      ),
    ).toMatchObject({ code: "InvalidArgument" });
    expect(
      await outcome(
        h.fleet.registerWorker({
          name: "v6",
          capabilities: [w],
          apiBaseUrl: "http://[fd00::1]/",
          dispatchPath: "/jobs",
        }),
      ),
    ).toMatchObject({ code: "InvalidArgument" });
    // A worker that asks for no dispatch (a director's node) registers it as before.
    expect(
      await outcome(
        h.fleet.registerWorker({
          name: "node",
          capabilities: [w],
          apiBaseUrl: "http://10.1.2.3:8080",
        }),
      ),
    ).toMatchObject({ code: "ok" });
    expect(
      await outcome(
        h.fleet.registerWorker({
          name: "short",
          apiBaseUrl: "http://a.example",
          dispatchSecret: "short",
        }),
      ),
    ).toMatchObject({ code: "InvalidArgument" });
    // Loopback is not allowed on this coordinator; a name is checked when resolved.
    const strict = await createHarness({ dispatchAllow: [] });
    try {
      const server = await serve(() => 200);
      const port = new URL(server.url).port;
      await strict.fleet.registerWorker({
        name: "local",
        capabilities: [w],
        apiBaseUrl: `http://localhost:${port}`,
      });
      const { task } = await strict.tasks.createTask({ workload: w, dispatch: true });
      const taskId = task?.taskId ?? "";
      await strict.tasks.scheduleTask({ taskId });
      await strict.app.dispatcher.runOnce();
      expect(server.received).toHaveLength(0);
      const got = await strict.tasks.getTask({ taskId });
      expect(got.task?.delivery?.state).toBe(DeliveryState.FAILED);
      // No other worker: given back, PENDING, the attempt not counted.
      expect(got.task).toMatchObject({
        state: TaskState.PENDING,
        error: { code: "DISPATCH_FAILED" },
      });
      const events = (await strict.tasks.listTaskEvents({ taskId })).events;
      expect(events.filter((e) => e.kind === "dispatch").map((e) => e.dispatch?.outcome)).toEqual([
        "forbidden",
      ]);
    } finally {
      await strict.close();
    }
  });

  it("keeps the dispatch secret write-only, and kept when registering again without it", async () => {
    const w = uniqueWorkload();
    const { workerId } = await h.fleet.registerWorker({
      name: "secretive",
      capabilities: [w],
      apiBaseUrl: "http://127.0.0.1:9",
      peerId: `p-${w}`,
      dispatchSecret: secret,
    });
    await h.fleet.registerWorker({
      name: "secretive",
      capabilities: [w],
      apiBaseUrl: "http://127.0.0.1:9",
      peerId: `p-${w}`,
    });
    const { worker: one } = await h.fleet.getWorker({ workerId });
    expect(one).toMatchObject({ hasDispatchSecret: true, dispatchPath: "/meshwork/tasks" });
    const list = await h.fleet.listWorkers({ pageSize: 1000 });
    const json = (v: unknown) =>
      JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? String(x) : x));
    expect(json(one)).not.toContain(secret);
    expect(JSON.stringify(list, (_k, v) => (typeof v === "bigint" ? String(v) : v))).not.toContain(
      secret,
    );
    const [row] = await rowsOf<{ s: string }>(
      h.app.database.db,
      sql`select dispatch_secret as s from workers where id = ${workerId}::uuid`,
    );
    expect(row?.s).toBe(secret);
  });

  it("takes dispatch from --dispatch-default when a create does not say", async () => {
    const on = await createHarness({ dispatchDefault: true });
    try {
      const { task } = await on.tasks.createTask({ workload: uniqueWorkload() });
      expect(task?.dispatch).toBe(true);
      const { task: off } = await on.tasks.createTask({
        workload: uniqueWorkload(),
        dispatch: false,
      });
      expect(off?.dispatch).toBe(false);
    } finally {
      await on.close();
    }
    const { task } = await h.tasks.createTask({ workload: uniqueWorkload() });
    expect(task?.dispatch).toBe(false);
  });

  it("takes dispatch from --dispatch-workloads for the workloads it names", async () => {
    const render = uniqueWorkload("render");
    const some = await createHarness({ dispatchWorkloads: [render] });
    try {
      const { tasks } = await some.tasks.createTasks({
        tasks: [
          { workload: render },
          { workload: uniqueWorkload() },
          { workload: render, dispatch: false },
        ],
      });
      expect(tasks.map((t) => t.dispatch)).toEqual([true, false, false]);
    } finally {
      await some.close();
    }
  });
});
