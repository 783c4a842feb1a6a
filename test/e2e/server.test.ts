import { mkdtempSync, rmSync } from "node:fs";
import * as http2 from "node:http2";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { ServerReflection } from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ServerReflectionAlpha } from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService, LeaseStatus } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { openDatabase } from "../../src/db/database.js";
import { listen } from "../../src/server.js";
import { createTestDatabase, onPostgres } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { appOn, uniqueWorkload } from "../support/harness.js";
import { useListeningServer } from "../support/server.js";

const server = useListeningServer();

/** A Connect JSON call with plain fetch over HTTP/1.1, as curl would make it. */
async function call(path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.url}/meshwork.v1.${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return {
    status: res.status,
    headers: res.headers,
    // biome-ignore lint/suspicious/noExplicitAny: response bodies are checked field by field
    body: (await res.json()) as Record<string, any>,
  };
}

describe("Connect JSON over HTTP/1.1 with fetch", () => {
  it("runs register → create → claim → renew → complete", async () => {
    const workload = uniqueWorkload();
    const reg = await call("FleetService/RegisterWorker", {
      name: "lab-01",
      capabilities: [workload],
    });
    expect(reg.status).toBe(200);
    const workerId = reg.body.workerId as string;
    expect(reg.body.heartbeatIntervalSeconds).toBe(15);
    const created = await call("TaskService/CreateTask", {
      workload,
      parameters: { query_id: "CHEMBL939" },
    });
    expect(created.body.task.state).toBe("TASK_STATE_PENDING");
    const claimed = await call("LeaseService/ClaimTasks", { worker_id: workerId, max_tasks: 1 });
    const claim = claimed.body.claims[0];
    expect(claim).toMatchObject({
      taskId: created.body.task.taskId,
      attempt: 1,
      parameters: { query_id: "CHEMBL939" },
    });
    const lease = { taskId: claim.taskId, workerId, attempt: 1, leaseToken: claim.leaseToken };
    const renewed = await call("LeaseService/RenewLease", lease);
    expect(Date.parse(renewed.body.leaseExpiresAt)).toBeGreaterThan(Date.now());
    const done = await call("LeaseService/CompleteTask", {
      ...lease,
      resultSummary: "12 hits",
      metrics: { rows: 12 },
    });
    expect(done.body.task).toMatchObject({
      state: "TASK_STATE_SUCCEEDED",
      resultSummary: "12 hits",
    });
  });

  it("echoes x-correlation-id, generates one when absent, and stores it on the task", async () => {
    const given = await call(
      "TaskService/CreateTask",
      { workload: "w" },
      { "x-correlation-id": "req-123" },
    );
    expect(given.headers.get("x-correlation-id")).toBe("req-123");
    expect(given.body.task.correlationId).toBe("req-123");
    const generated = await call("TaskService/CreateTask", { workload: "w" });
    const id = generated.headers.get("x-correlation-id");
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    expect(generated.body.task.correlationId).toBe(id);
    const error = await call(
      "TaskService/GetTask",
      { taskId: "nope" },
      { "x-correlation-id": "bad-1" },
    );
    expect(error.headers.get("x-correlation-id")).toBe("bad-1");
    const health = await fetch(`${server.url}/healthz`, { headers: { "x-correlation-id": "hz" } });
    expect(health.headers.get("x-correlation-id")).toBe("hz");
  });

  it("answers malformed JSON, wrong field types and unknown fields with 400, creating nothing", async () => {
    const corr = { "x-correlation-id": `bad-json-${Date.now()}` };
    const malformed = await call("TaskService/CreateTask", "{not json", corr);
    expect(malformed).toMatchObject({ status: 400, body: { code: "invalid_argument" } });
    const wrongType = await call(
      "TaskService/CreateTask",
      { workload: 12, priority: "high" },
      corr,
    );
    expect(wrongType).toMatchObject({ status: 400, body: { code: "invalid_argument" } });
    const unknownField = await call(
      "TaskService/CreateTask",
      { workload: "w", flavour: "x" },
      corr,
    );
    expect(unknownField).toMatchObject({ status: 400, body: { code: "invalid_argument" } });
    const listed = await call("TaskService/ListTasks", { correlationId: corr["x-correlation-id"] });
    expect(listed.body.tasks ?? []).toEqual([]);
  });

  it("maps refusals to HTTP statuses: 404 unknown, 409 lease conflict", async () => {
    const missing = await call("TaskService/GetTask", {
      taskId: "00000000-0000-4000-8000-000000000000",
    });
    expect(missing).toMatchObject({ status: 404, body: { code: "not_found" } });
    const workload = uniqueWorkload();
    const workerId = (await call("FleetService/RegisterWorker", { capabilities: [workload] })).body
      .workerId;
    await call("TaskService/CreateTask", { workload });
    const claim = (await call("LeaseService/ClaimTasks", { workerId })).body.claims[0];
    const stale = await call("LeaseService/CompleteTask", {
      taskId: claim.taskId,
      workerId,
      attempt: 2,
    });
    expect(stale).toMatchObject({ status: 409, body: { code: "aborted" } });
    expect(JSON.stringify(stale.body)).not.toMatch(/select|update|tasks"|at .*\.ts/i);
  });

  it("serves /healthz and /readyz", async () => {
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
    const ready = await fetch(`${server.url}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: "ready" });
  });
});

describe("plain routes", () => {
  it("answer an unknown path 404 with a JSON body, and a known path asked with another method 405 with Allow", async () => {
    const unknown = await fetch(`${server.url}/no/such/route`);
    expect(unknown.status).toBe(404);
    expect(unknown.headers.get("content-type")).toMatch(/^application\/json/);
    expect(await unknown.json()).toMatchObject({ error: "not_found" });

    const wrong = await fetch(`${server.url}/healthz`, { method: "DELETE" });
    expect(wrong.status).toBe(405);
    expect(wrong.headers.get("allow")).toBe("GET");
    expect(await wrong.json()).toMatchObject({ error: "unimplemented" });

    // A REST route: the methods of every route on the path.
    const rest = await fetch(`${server.url}/api/mesh/tasks`, { method: "PATCH" });
    expect(rest.status).toBe(405);
    expect(rest.headers.get("allow")?.split(", ").sort()).toEqual(["GET", "POST"]);
  });
});

describe("gRPC over h2c with generated clients", () => {
  const grpc = () => createGrpcTransport({ baseUrl: server.url });

  it("claims and completes over gRPC, holding the lease on a real StreamLeases bidi stream", async () => {
    const fleet = createClient(FleetService, grpc());
    const tasks = createClient(TaskService, grpc());
    const leases = createClient(LeaseService, grpc());
    const workload = uniqueWorkload();
    const { workerId } = await fleet.registerWorker({
      capabilities: [workload],
      maxConcurrency: 10,
    });
    await tasks.createTasks({ tasks: [{ workload }, { workload }] });
    const { claims } = await leases.claimTasks({ workerId, maxTasks: 2 });
    expect(claims).toHaveLength(2);
    const [a, b] = claims;
    if (!a || !b) throw new Error("claims");
    // Cancel b while the stream is open: the next message reports it.
    const outbox: Array<() => void> = [];
    let sent = 0;
    async function* requests() {
      for (; sent < 2; sent++) {
        if (sent === 1) await new Promise<void>((r) => outbox.push(r));
        yield {
          workerId,
          queueDepth: 2,
          leases: claims.map((c) => ({
            taskId: c.taskId,
            attempt: c.attempt,
            leaseToken: c.leaseToken,
          })),
        };
      }
    }
    const statuses: LeaseStatus[][] = [];
    for await (const res of leases.streamLeases(requests())) {
      statuses.push(res.leases.map((l) => l.status));
      expect(res.drained).toBe(false);
      if (statuses.length === 1) {
        await tasks.cancelTask({ taskId: b.taskId });
        outbox.shift()?.();
      }
    }
    expect(statuses).toEqual([
      [LeaseStatus.RENEWED, LeaseStatus.RENEWED],
      [LeaseStatus.RENEWED, LeaseStatus.CANCELED],
    ]);
    const { results } = await leases.completeTasks({
      completions: [{ taskId: a.taskId, workerId, attempt: a.attempt, leaseToken: a.leaseToken }],
    });
    expect(results[0]?.outcome.case).toBe("task");
    expect((await fleet.getWorker({ workerId })).worker?.queueDepth).toBeGreaterThanOrEqual(0);
  });

  it("carries errors with codes and ErrorInfo details over gRPC", async () => {
    const leases = createClient(LeaseService, grpc());
    const res = await outcome(
      leases.completeTask({
        taskId: "00000000-0000-4000-8000-000000000000",
        workerId: "00000000-0000-4000-8000-000000000001",
        attempt: 1,
      }),
    );
    expect(res).toMatchObject({ code: "NotFound", reason: "NOT_FOUND" });
  });

  it("serves gRPC-Web over HTTP/1.1", async () => {
    const tasks = createClient(
      TaskService,
      createGrpcWebTransport({ baseUrl: server.url, httpVersion: "1.1" }),
    );
    const { task } = await tasks.createTask({ workload: "web" });
    expect(task?.state).toBe(TaskState.PENDING);
  });

  it("answers grpc.health.v1.Health", async () => {
    const health = createClient(Health, grpc());
    expect((await health.check({})).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    expect((await health.check({ service: "meshwork.v1.LeaseService" })).status).toBe(
      HealthCheckResponse_ServingStatus.SERVING,
    );
    expect((await outcome(health.check({ service: "nope.Service" }))).code).toBe("NotFound");
    // Open to anyone, so it reads little: a long body is refused, not buffered.
    const big = await outcome(health.check({ service: "x".repeat(4096) }));
    expect(big.code).toBe("ResourceExhausted");
  });

  it("answers server reflection v1 and v1alpha", async () => {
    for (const service of [ServerReflection, ServerReflectionAlpha]) {
      const reflection = createClient(service as typeof ServerReflection, grpc());
      async function* ask() {
        yield { messageRequest: { case: "listServices" as const, value: "" } };
        yield {
          messageRequest: {
            case: "fileContainingSymbol" as const,
            value: "meshwork.v1.LeaseService.ClaimTasks",
          },
        };
      }
      const answers = [];
      for await (const res of reflection.serverReflectionInfo(ask())) answers.push(res);
      const [list, file] = answers;
      expect(list?.messageResponse.case).toBe("listServicesResponse");
      const names =
        list?.messageResponse.case === "listServicesResponse"
          ? list.messageResponse.value.service.map((s) => s.name)
          : [];
      expect(names).toEqual(
        expect.arrayContaining(["meshwork.v1.TaskService", "grpc.health.v1.Health"]),
      );
      expect(file?.messageResponse.case).toBe("fileDescriptorResponse");
      const count =
        file?.messageResponse.case === "fileDescriptorResponse"
          ? file.messageResponse.value.fileDescriptorProto.length
          : 0;
      expect(count).toBeGreaterThan(1); // lease.proto and the files it imports
    }
  });
});

/** One gRPC call over a fresh h2c session: its grpc-status and grpc-message (trailer or header). */
async function grpcCall(
  path: string,
  contentType: string,
  payload: Buffer,
): Promise<{ status: string; message: string }> {
  const session = http2.connect(server.url);
  try {
    return await new Promise((resolve, reject) => {
      const frame = Buffer.alloc(5);
      frame.writeUInt32BE(payload.length, 1);
      const req = session.request({
        ":method": "POST",
        ":path": path,
        "content-type": contentType,
        te: "trailers",
      });
      let found = { status: "", message: "" };
      const take = (h: http2.IncomingHttpHeaders) => {
        if (h["grpc-status"] !== undefined)
          found = {
            status: String(h["grpc-status"]),
            message: decodeURIComponent(String(h["grpc-message"] ?? "")),
          };
      };
      // A call left unanswered fails the test rather than hanging it.
      const timer = setTimeout(() => req.close(http2.constants.NGHTTP2_CANCEL), 5000);
      req.on("response", take);
      req.on("trailers", take);
      req.on("data", () => {});
      req.on("error", reject);
      req.on("close", () => {
        clearTimeout(timer);
        resolve(found);
      });
      req.end(Buffer.concat([frame, payload]));
    });
  } finally {
    session.close();
  }
}

describe("requests that cannot be decoded", () => {
  const path = "/meshwork.v1.TaskService/GetTask";

  it("are invalid_argument (400), not internal, in Connect binary and with a broken gzip body", async () => {
    const truncated = await fetch(`${server.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/proto" },
      body: new Uint8Array([0x0a, 0x05]), // task_id promising 5 bytes, none sent
    });
    expect(truncated.status).toBe(400);
    expect(await truncated.json()).toMatchObject({ code: "invalid_argument" });
    const gzip = await fetch(`${server.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", "content-encoding": "gzip" },
      body: new Uint8Array(gzipSync("{}").subarray(0, 12)), // cut short
    });
    expect(gzip.status).toBe(400);
    expect(await gzip.json()).toMatchObject({ code: "invalid_argument" });
  });

  it("are INVALID_ARGUMENT (3) over gRPC, unary and streaming", async () => {
    expect(await grpcCall(path, "application/grpc", Buffer.from([0x0a, 0x05]))).toMatchObject({
      status: "3",
    });
    expect(
      await grpcCall(
        "/meshwork.v1.ArtifactService/UploadArtifact",
        "application/grpc",
        Buffer.from([0x0a, 0x05]),
      ),
    ).toMatchObject({ status: "3" });
  });

  it("are answered over gRPC even when the parser quotes half of a character", async () => {
    // JSON.parse reports the first UTF-16 unit of "😀", a lone surrogate, which
    // gRPC's percent-encoding of grpc-message cannot encode.
    const res = await grpcCall(path, "application/grpc+json", Buffer.from("😀"));
    expect(res.status).toBe("3");
    expect(res.message).toContain("\ufffd");
  });
});

describe("shutdown and restart", () => {
  it("ends an in-flight long poll on shutdown and keeps every task across a restart", async () => {
    // A restart needs a database that outlives one open: a database of its
    // own on PostgreSQL (an error there fails the test), a data dir on PGlite.
    const own = onPostgres ? await createTestDatabase() : undefined;
    const dataDir = own ? "" : mkdtempSync(join(tmpdir(), "meshwork-restart-"));
    const open = () =>
      own ? openDatabase({ url: own.url, dataDir: "" }) : openDatabase({ dataDir });
    try {
      const db1 = await open();
      const first = await listen(appOn(db1), "127.0.0.1:0");
      const fleet = createClient(FleetService, createGrpcTransport({ baseUrl: first.url }));
      const tasks = createClient(TaskService, createGrpcTransport({ baseUrl: first.url }));
      const leases = createClient(LeaseService, createGrpcTransport({ baseUrl: first.url }));
      const workload = uniqueWorkload();
      const { workerId } = await fleet.registerWorker({
        capabilities: [workload],
        maxConcurrency: 10,
      });
      const created = await tasks.createTasks({
        tasks: [
          { workload, name: "a" },
          { workload, name: "b" },
        ],
      });
      const { claims } = await leases.claimTasks({ workerId });
      const polling = leases.claimTasks({
        workerId: (await fleet.registerWorker({ capabilities: ["idle"] })).workerId,
        waitSeconds: 30,
      });
      await new Promise((r) => setTimeout(r, 200));
      await first.close();
      expect((await polling).claims).toEqual([]);
      await db1.close();

      const db2 = await open();
      const second = await listen(appOn(db2), "127.0.0.1:0");
      const tasks2 = createClient(TaskService, createGrpcTransport({ baseUrl: second.url }));
      const leases2 = createClient(LeaseService, createGrpcTransport({ baseUrl: second.url }));
      for (const t of created.tasks) {
        const { task } = await tasks2.getTask({ taskId: t.taskId });
        expect(task?.name).toBe(t.name);
      }
      const claim = claims[0];
      if (!claim) throw new Error("claim");
      const done = await leases2.completeTask({
        taskId: claim.taskId,
        workerId,
        attempt: 1,
        leaseToken: claim.leaseToken,
      });
      expect(done.task?.state).toBe(TaskState.SUCCEEDED);
      await second.close();
      await db2.close();
    } finally {
      await own?.drop();
      if (dataDir) rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
