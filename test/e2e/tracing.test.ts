import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { createApp } from "../../src/app.js";
import { createLogger } from "../../src/log.js";
import { createWorker, type Worker } from "../../src/sdk/worker.js";
import { listen, type RunningServer } from "../../src/server.js";
import { until } from "../support/bounded.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { registerWorker, testConfig, uniqueWorkload } from "../support/harness.js";

// W3C trace context end to end (docs/tracing.md): a client's traceparent on
// CreateTask is stored with the task, returned in claims (RPC and REST),
// seen by an SDK worker's handler and sent back on its calls for the task,
// and written in the coordinator's log lines; a malformed one is ignored.

const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
const clientSpan = "00f067aa0ba902b7";
const traceparent = `00-${traceId}-${clientSpan}-01`;
const tracestate = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
const traceparentPattern = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

interface LogLine {
  msg: string;
  rpc?: string;
  code?: string;
  correlation_id?: string;
  trace_id?: string;
  span_id?: string;
}

describe("trace context", () => {
  let tdb: TestDatabase;
  let server: RunningServer;
  const lines: LogLine[] = [];
  const workers: Worker[] = [];
  let tasks: Client<typeof TaskService>;
  let fleet: Client<typeof FleetService>;
  let leases: Client<typeof LeaseService>;

  beforeAll(async () => {
    tdb = await createTestDatabase();
    const sink = { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) };
    const app = createApp(tdb.database, testConfig(), createLogger("debug", sink));
    server = await listen(app, "127.0.0.1:0");
    const transport = createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" });
    tasks = createClient(TaskService, transport);
    fleet = createClient(FleetService, transport);
    leases = createClient(LeaseService, transport);
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop().catch(() => {})));
    await server?.close();
    await tdb?.drop();
  });

  /** CreateTask over Connect JSON, as any HTTP client would send it. */
  async function createJson(
    workload: string,
    headers: Record<string, string>,
  ): Promise<{ status: number; task: Record<string, unknown> }> {
    const res = await fetch(`${server.url}/meshwork.v1.TaskService/CreateTask`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ workload }),
    });
    const body = (await res.json()) as { task: Record<string, unknown> };
    return { status: res.status, task: body.task };
  }

  it("stores the caller's trace with the task, returns it in RPC and REST claims, and logs it", async () => {
    const workload = uniqueWorkload("trace");
    const created = await createJson(workload, {
      traceparent,
      tracestate,
      "x-correlation-id": "trace-test-1",
    });
    expect(created.status).toBe(200);
    const stored = traceparentPattern.exec(String(created.task.traceparent));
    // The caller's trace, with the CreateTask call's span as the parent.
    expect(stored?.[1]).toBe(traceId);
    expect(stored?.[2]).not.toBe(clientSpan);
    expect(stored?.[3]).toBe("01");
    expect(created.task.tracestate).toBe(tracestate);
    const taskId = String(created.task.taskId);

    // The CreateTask log line: the trace id and the call's span beside the correlation id.
    const line = lines.find(
      (l) => l.rpc === "meshwork.v1.TaskService/CreateTask" && l.correlation_id === "trace-test-1",
    );
    expect(line).toMatchObject({ msg: "rpc", code: "ok", trace_id: traceId, span_id: stored?.[2] });

    // GetTask shows it.
    const { task } = await tasks.getTask({ taskId });
    expect(task?.traceparent).toBe(created.task.traceparent);
    expect(task?.tracestate).toBe(tracestate);

    // A ClaimTasks (RPC) returns it.
    const workerId = await registerWorker({ fleet }, [workload]);
    const { claims } = await leases.claimTasks({ workerId, maxTasks: 1 });
    expect(claims.map((c) => [c.taskId, c.traceparent, c.tracestate])).toEqual([
      [taskId, created.task.traceparent, tracestate],
    ]);

    // The REST claim (worker contract) returns it too.
    const other = await createJson(workload, { traceparent });
    const register = await fetch(`${server.url}/workers/register`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ name: "rest", capabilities: [workload], cpu_count: 1, memory_mb: 1 }),
    });
    const { worker_id } = (await register.json()) as { worker_id: string };
    const rest = await fetch(`${server.url}/tasks/claim`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ worker_id, capabilities: [workload], max_concurrency: 1 }),
    });
    expect(rest.status).toBe(200);
    const restClaim = (await rest.json()) as Record<string, unknown>;
    expect(restClaim).toMatchObject({
      task_id: other.task.taskId,
      traceparent: other.task.traceparent,
      tracestate: "",
    });
    expect(traceparentPattern.exec(String(restClaim.traceparent))?.[1]).toBe(traceId);
  });

  it("carries it over gRPC too", async () => {
    const grpc = createClient(TaskService, createGrpcTransport({ baseUrl: server.url }));
    const { task } = await grpc.createTask(
      { workload: uniqueWorkload("trace-grpc") },
      { headers: { traceparent } },
    );
    expect(traceparentPattern.exec(task?.traceparent ?? "")?.[1]).toBe(traceId);
  });

  it("hands it to an SDK worker's handler, which sends it back on its calls for the task", async () => {
    const workload = uniqueWorkload("trace-sdk");
    const created = await createJson(workload, { traceparent, tracestate });
    const taskId = String(created.task.taskId);
    const seen: { traceId: string; traceparent: string; ctxTraceId: string }[] = [];
    const sent = new Map<string, string | null>();
    const w = createWorker({
      interceptors: [
        (next) => (req) => {
          sent.set(req.method.name, req.header.get("traceparent"));
          return next(req);
        },
      ],
      url: server.url,
      token: "",
      workloads: [workload],
      pollSeconds: 1,
      installSignalHandlers: false,
      log: () => {},
      handler: (task, ctx) => {
        seen.push({
          traceId: task.traceId,
          traceparent: task.traceparent,
          ctxTraceId: ctx.traceId,
        });
        return { summary: "done" };
      },
    });
    workers.push(w);
    await until(
      async () => (await tasks.getTask({ taskId })).task?.state === TaskState.SUCCEEDED,
      15_000,
    );
    expect(seen).toEqual([{ traceId, traceparent: created.task.traceparent, ctxTraceId: traceId }]);
    // The worker sent the task's traceparent on its CompleteTask (not on its claims).
    expect(sent.get("CompleteTask")).toBe(created.task.traceparent);
    expect(sent.get("ClaimTasks")).toBeNull();
    // The coordinator logged the worker's CompleteTask in the task's trace.
    const complete = lines.find(
      (l) => l.rpc === "meshwork.v1.LeaseService/CompleteTask" && l.trace_id === traceId,
    );
    expect(complete).toMatchObject({ msg: "rpc", code: "ok" });
  });

  it("ignores a malformed traceparent: the task is created in a new trace", async () => {
    const malformed = [
      `00-${"0".repeat(32)}-${clientSpan}-01`, // all-zero trace id
      `00-${traceId}-${"0".repeat(16)}-01`, // all-zero parent id
      `ff-${traceId}-${clientSpan}-01`, // version ff
      `00-${traceId.toUpperCase()}-${clientSpan}-01`, // uppercase
      `00-${traceId}-${clientSpan}-01-extra`, // version 00 with more fields
      `00-${traceId}-${clientSpan}`, // no flags
      "not a traceparent",
    ];
    for (const bad of malformed) {
      const created = await createJson(uniqueWorkload("trace-bad"), {
        traceparent: bad,
        tracestate,
      });
      expect(created.status, bad).toBe(200);
      const stored = traceparentPattern.exec(String(created.task.traceparent));
      expect(stored, bad).not.toBeNull();
      expect(stored?.[1], bad).not.toBe(traceId);
      expect(stored?.[1], bad).not.toBe("0".repeat(32));
      // Begun here, not recorded anywhere: not sampled; tracestate means nothing alone.
      expect(stored?.[3], bad).toBe("00");
      expect(created.task.tracestate ?? "", bad).toBe("");
    }
  });

  it("gives a request without a traceparent a trace id of its own, in its log lines", async () => {
    const created = await createJson(uniqueWorkload("trace-none"), {
      "x-correlation-id": "trace-test-none",
    });
    const stored = traceparentPattern.exec(String(created.task.traceparent));
    const line = lines.find((l) => l.correlation_id === "trace-test-none");
    expect(line?.trace_id).toMatch(/^[0-9a-f]{32}$/);
    expect(line?.trace_id).toBe(stored?.[1]);
  });

  it("keeps a valid traceparent of a later version, and drops a tracestate that is not W3C's", async () => {
    const created = await createJson(uniqueWorkload("trace-v"), {
      traceparent: `01-${traceId}-${clientSpan}-01-future`,
      tracestate: "Not Valid!",
    });
    expect(traceparentPattern.exec(String(created.task.traceparent))?.[1]).toBe(traceId);
    expect(created.task.tracestate ?? "").toBe("");
  });
});
