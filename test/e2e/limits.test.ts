import { once } from "node:events";
import * as http from "node:http";
import * as http2 from "node:http2";
import { createGzip, gzipSync } from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ClaimTasksRequestSchema, LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { clampDeadline, listen, type RunningServer } from "../../src/server.js";
import { within } from "../support/bounded.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { appOn, uniqueWorkload } from "../support/harness.js";

/**
 * One coordinator with tight limits, so that each one trips within a second
 * or two: every test below ends with the server still answering others.
 */
const limits = {
  readMaxBytes: 4 * 1024 * 1024,
  maxTimeoutMs: 1000,
  headersTimeoutMs: 1000,
  requestTimeoutMs: 60_000,
  idleTimeoutMs: 1000,
  maxConcurrentStreams: 100,
  maxHeaderBytes: 8192,
};

let tdb: TestDatabase;
let server: RunningServer;
let port: number;

beforeAll(async () => {
  tdb = await createTestDatabase();
  server = await listen(appOn(tdb.database, limits), "127.0.0.1:0");
  port = server.port;
});
afterAll(async () => {
  await server?.close();
  await tdb?.drop();
});

const MiB = 1024 * 1024;

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** One HTTP/1.1 request on a connection of its own. */
function h1(path: string, headers: http.OutgoingHttpHeaders, body?: Buffer | string) {
  return new Promise<Answer>((resolve, reject) => {
    const req = http.request(
      {
        host: "127.0.0.1",
        port,
        method: body === undefined ? "GET" : "POST",
        path,
        headers,
        agent: false,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            body: Buffer.concat(chunks).toString(),
          }),
        );
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

interface H2Answer {
  headers: http2.IncomingHttpHeaders;
  trailers: http2.IncomingHttpHeaders;
  body: Buffer;
  rstCode: number;
}

/** One HTTP/2 request on a session of its own (h2c). */
async function h2(headers: http2.OutgoingHttpHeaders, body?: Buffer): Promise<H2Answer> {
  const session = http2.connect(`http://127.0.0.1:${port}`);
  session.on("error", () => {});
  try {
    return await new Promise<H2Answer>((resolve, reject) => {
      const stream = session.request({ ":method": "POST", ...headers });
      const answer: H2Answer = { headers: {}, trailers: {}, body: Buffer.alloc(0), rstCode: 0 };
      const chunks: Buffer[] = [];
      stream.on("response", (h) => {
        answer.headers = h;
      });
      stream.on("trailers", (t) => {
        answer.trailers = t;
      });
      stream.on("data", (c: Buffer) => chunks.push(c));
      stream.on("error", () => {});
      stream.on("close", () => {
        answer.body = Buffer.concat(chunks);
        answer.rstCode = stream.rstCode ?? 0;
        resolve(answer);
      });
      session.on("close", () => reject(new Error("session closed")));
      stream.end(body);
    });
  } finally {
    session.close();
  }
}

/** A gRPC frame: the compressed flag, the length, the message. */
function grpcFrame(message: Buffer, compressed: boolean): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt8(compressed ? 1 : 0, 0);
  head.writeUInt32BE(message.length, 1);
  return Buffer.concat([head, message]);
}

function grpcHeaders(method: string, extra: http2.OutgoingHttpHeaders = {}) {
  return {
    ":path": `/meshwork.v1.${method}`,
    "content-type": "application/grpc",
    te: "trailers",
    ...extra,
  };
}

/** grpc-status of an answer, from its trailers or a trailers-only response. */
function grpcStatus(a: H2Answer): string | undefined {
  return (a.trailers["grpc-status"] ?? a.headers["grpc-status"]) as string | undefined;
}

/** TaskService over gRPC (HTTP/2, connect-node's client). */
const tasksOverGrpc = () => createClient(TaskService, createGrpcTransport({ baseUrl: server.url }));

/** The server answers a Connect call over HTTP/1.1 and a gRPC call over HTTP/2, each on a new connection. */
async function stillServes(): Promise<boolean> {
  const overH1 = await h1(
    "/meshwork.v1.TaskService/ListTasks",
    { "content-type": "application/json" },
    "{}",
  );
  const overH2 = await h2(grpcHeaders("TaskService/ListTasks"), grpcFrame(Buffer.alloc(0), false));
  return overH1.status === 200 && grpcStatus(overH2) === "0";
}

async function taskCount(): Promise<number> {
  const { tasks } = await tasksOverGrpc().listTasks({ pageSize: 1000 });
  return tasks.length;
}

describe("message size (readMaxBytes, 4 MiB)", () => {
  it("refuses a 5 MiB CreateTask over Connect JSON and over gRPC with resource_exhausted, creating nothing", async () => {
    const workload = uniqueWorkload("big");
    const big = { workload, parameters: { blob: "x".repeat(5 * MiB) } };
    const overConnect = await h1(
      "/meshwork.v1.TaskService/CreateTask",
      { "content-type": "application/json" },
      JSON.stringify(big),
    );
    expect(overConnect.status).toBe(429);
    expect(JSON.parse(overConnect.body)).toMatchObject({ code: "resource_exhausted" });
    expect((await outcome(tasksOverGrpc().createTask(big))).code).toBe("ResourceExhausted");
    // The same request under the cap goes through: the size is what was refused.
    const small = { workload, parameters: { blob: "x".repeat(MiB) } };
    const created = await h1(
      "/meshwork.v1.TaskService/CreateTask",
      { "content-type": "application/json" },
      JSON.stringify(small),
    );
    expect(created.status).toBe(200);
    const { tasks } = await tasksOverGrpc().listTasks({ workload });
    expect(tasks).toHaveLength(1);
    expect(await stillServes()).toBe(true);
  });
});

/**
 * `prefix` followed by `inflated` zero bytes, gzipped by streaming a 1 MiB
 * buffer of zeros through zlib: the 1 GiB is never in memory (~1 MiB out).
 */
async function gzipBomb(prefix: string, inflated: number): Promise<Buffer> {
  const gzip = createGzip({ level: 9 });
  const chunks: Buffer[] = [];
  gzip.on("data", (c: Buffer) => chunks.push(c));
  const ended = once(gzip, "end");
  gzip.write(prefix);
  const zeros = Buffer.alloc(MiB);
  for (let i = 0; i < inflated / MiB; i++) {
    if (!gzip.write(zeros)) await once(gzip, "drain");
  }
  gzip.end();
  await ended;
  return Buffer.concat(chunks);
}

describe("compressed requests", () => {
  let bomb: Buffer;
  const workload = uniqueWorkload("bomb");
  beforeAll(async () => {
    bomb = await gzipBomb(`{"workload":"${workload}","parameters":{"p":"`, 1024 * MiB);
  });

  it("refuses a gzip body that inflates to 1 GiB, while inflating, over Connect and gRPC", async () => {
    expect(bomb.length).toBeLessThan(2 * MiB);
    const tasksBefore = await taskCount();
    const rssBefore = process.memoryUsage().rss;
    const connect = await h1(
      "/meshwork.v1.TaskService/CreateTask",
      { "content-type": "application/json", "content-encoding": "gzip" },
      bomb,
    );
    expect(connect.status).toBe(429);
    expect(JSON.parse(connect.body)).toMatchObject({
      code: "resource_exhausted",
      message: expect.stringContaining("after decompression"),
    });
    const grpc = await h2(
      grpcHeaders("TaskService/CreateTask", { "grpc-encoding": "gzip" }),
      grpcFrame(bomb, true),
    );
    expect(grpcStatus(grpc)).toBe("8"); // RESOURCE_EXHAUSTED
    // A bound, not a measurement: inflating the 1 GiB would take it far
    // past this; stopping at the 4 MiB cap costs a few MiB. The server runs
    // in this process.
    expect(process.memoryUsage().rss - rssBefore).toBeLessThan(50 * MiB);
    expect(await taskCount()).toBe(tasksBefore);
    expect(await stillServes()).toBe(true);
  });

  it("accepts a gzip body within the cap: compression itself is welcome", async () => {
    const ok = await h1(
      "/meshwork.v1.TaskService/CreateTask",
      { "content-type": "application/json", "content-encoding": "gzip" },
      gzipSync(JSON.stringify({ workload, parameters: { p: "x".repeat(MiB) } })),
    );
    expect(ok.status).toBe(200);
    const { tasks } = await tasksOverGrpc().listTasks({ workload });
    expect(tasks).toHaveLength(1);
  });

  it("refuses unknown encodings with unimplemented, naming the supported ones", async () => {
    const tasksBefore = await taskCount();
    const connect = await h1(
      "/meshwork.v1.TaskService/CreateTask",
      { "content-type": "application/json", "content-encoding": "x-nope" },
      `{"workload":"${workload}"}`,
    );
    expect(connect.status).toBe(501);
    expect(JSON.parse(connect.body)).toMatchObject({
      code: "unimplemented",
      message: 'unknown compression "x-nope": supported encodings are gzip,br',
    });
    const grpc = await h2(
      grpcHeaders("TaskService/CreateTask", { "grpc-encoding": "x-nope" }),
      grpcFrame(Buffer.from("ignored"), true),
    );
    expect(grpcStatus(grpc)).toBe("12"); // UNIMPLEMENTED
    expect(decodeURIComponent(String(grpc.trailers["grpc-message"]))).toBe(
      'unknown compression "x-nope": supported encodings are gzip,br',
    );
    expect(await taskCount()).toBe(tasksBefore);
  });
});

describe("client deadlines (maxTimeoutMs, 1 s here)", () => {
  it("clamps a longer deadline: a 30 s long poll asked with 60 s ends after about a second", async () => {
    const workload = uniqueWorkload("poll");
    const reg = await h1(
      "/meshwork.v1.FleetService/RegisterWorker",
      { "content-type": "application/json" },
      JSON.stringify({ name: "w", capabilities: [workload] }),
    );
    const workerId = JSON.parse(reg.body).workerId as string;
    // The clients' own deadline is 60 s (connect-timeout-ms: 60000,
    // grpc-timeout: 60000m); the server holds the call for 1 s, and
    // ClaimTasks ends its poll when the call's signal fires, answering with
    // what it has: no claims. Unclamped, the poll would last 30 s, and
    // connect-node alone would refuse the deadline (invalid_argument).
    const connect = createClient(
      LeaseService,
      createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" }),
    );
    const grpc = createClient(LeaseService, createGrpcTransport({ baseUrl: server.url }));
    for (const client of [connect, grpc]) {
      const started = Date.now();
      const answer = await within(
        10_000,
        client.claimTasks({ workerId, waitSeconds: 30 }, { timeoutMs: 60_000 }),
      );
      expect(answer).toMatchObject({ claims: [] });
      // It did wait (a long poll, not a refusal), up to the clamped deadline.
      expect(Date.now() - started).toBeGreaterThanOrEqual(900);
    }
  });

  it("clamps grpc-timeout in any unit (1H here), where connect-node alone refuses it", async () => {
    const workerId = JSON.parse(
      (
        await h1(
          "/meshwork.v1.FleetService/RegisterWorker",
          { "content-type": "application/json" },
          JSON.stringify({ name: "w", capabilities: [uniqueWorkload("poll")] }),
        )
      ).body,
    ).workerId as string;
    const request = create(ClaimTasksRequestSchema, { workerId, waitSeconds: 30 });
    const hour = await within(
      10_000,
      h2(
        grpcHeaders("LeaseService/ClaimTasks", { "grpc-timeout": "1H" }),
        grpcFrame(Buffer.from(toBinary(ClaimTasksRequestSchema, request)), false),
      ),
    );
    expect(hour !== "timed out" && grpcStatus(hour)).toBe("0");
  });

  it("rewrites only deadlines above the cap; shorter, absent and malformed ones are left alone", () => {
    const headersAfter = (headers: Record<string, string>) => {
      const req = { headers: { ...headers } } as unknown as http.IncomingMessage;
      clampDeadline(req, 1000);
      return req.headers;
    };
    expect(headersAfter({ "connect-timeout-ms": "60000" })).toEqual({
      "connect-timeout-ms": "1000",
    });
    expect(headersAfter({ "connect-timeout-ms": "999" })).toEqual({ "connect-timeout-ms": "999" });
    expect(headersAfter({ "connect-timeout-ms": "1s" })).toEqual({ "connect-timeout-ms": "1s" });
    expect(headersAfter({ "grpc-timeout": "2S" })).toEqual({ "grpc-timeout": "1000m" });
    expect(headersAfter({ "grpc-timeout": "1H" })).toEqual({ "grpc-timeout": "1000m" });
    expect(headersAfter({ "grpc-timeout": "999999u" })).toEqual({ "grpc-timeout": "999999u" });
    expect(headersAfter({ "grpc-timeout": "5" })).toEqual({ "grpc-timeout": "5" });
    expect(headersAfter({})).toEqual({});
  });
});
