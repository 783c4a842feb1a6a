import { once } from "node:events";
import { readFileSync } from "node:fs";
import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import * as tls from "node:tls";
import { createGzip, gzipSync } from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ClaimTasksRequestSchema, LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import type { App } from "../../src/app.js";
import { clampDeadline, listen, type RunningServer } from "../../src/server.js";
import { within } from "../support/bounded.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { appOn, uniqueWorkload } from "../support/harness.js";
import { selfSignedCert } from "../support/tls.js";

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
let app: App;
let server: RunningServer;
let port: number;

beforeAll(async () => {
  tdb = await createTestDatabase();
  app = appOn(tdb.database, limits);
  server = await listen(app, "127.0.0.1:0");
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

/**
 * One HTTP/2 request on a session of its own (h2c). `settled`: first wait
 * until the server has our acknowledgement of its SETTINGS (a PING round trip
 * after it), from when on its advertised limits apply.
 */
async function h2(
  headers: http2.OutgoingHttpHeaders,
  body?: Buffer,
  settled = false,
): Promise<H2Answer> {
  const session = http2.connect(`http://127.0.0.1:${port}`);
  session.on("error", () => {});
  try {
    if (settled) {
      await once(session, "remoteSettings");
      await new Promise((resolve, reject) =>
        session.ping((err) => (err ? reject(err) : resolve(undefined))),
      );
    }
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
    /** ClaimTasks calls counted as ended by their deadline (metrics/interceptor.ts). */
    const endedByDeadline = async () =>
      (await app.metrics.rpcRequests.get()).values
        .filter((v) => v.labels.method === "ClaimTasks" && v.labels.code === "deadline_exceeded")
        .reduce((total, v) => total + v.value, 0);
    for (const client of [connect, grpc]) {
      const before = await endedByDeadline();
      // The 10 s bound only guards against a hang (the 30 s asked for, the 60 s deadline).
      const answer = await within(
        10_000,
        client.claimTasks({ workerId, waitSeconds: 30 }, { timeoutMs: 60_000 }),
      );
      expect(answer).toMatchObject({ claims: [] });
      // It did wait (a long poll, not a refusal), until the clamped deadline ended it.
      expect(await endedByDeadline()).toBe(before + 1);
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

/** A socket's close, or "timed out" after `ms` (the socket is then destroyed). */
async function closedWithin(socket: net.Socket, ms: number): Promise<"closed" | "timed out"> {
  const closed = socket.closed ? Promise.resolve() : once(socket, "close");
  const result = await within(
    ms,
    closed.then(() => "closed" as const),
  );
  socket.destroy();
  return result;
}

async function connected(): Promise<net.Socket> {
  const socket = net.connect(port, "127.0.0.1");
  socket.on("error", () => {});
  await once(socket, "connect");
  return socket;
}

describe("slow and idle connections (headersTimeoutMs and idleTimeoutMs, 1 s here)", () => {
  it("cuts off a client that sends its HTTP/1.1 headers a byte at a time, serving others meanwhile", async () => {
    const socket = await connected();
    const received: Buffer[] = [];
    socket.on("data", (d: Buffer) => received.push(d));
    const request = Buffer.from(
      `GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ${"a".repeat(200)}\r\n\r\n`,
    );
    let sent = 0;
    let othersServed = 0;
    // At most 100 bytes, one every 200 ms: 20 s, far past the 1 s headers timeout.
    for (; sent < 100 && !socket.closed && !socket.destroyed; sent++) {
      socket.write(request.subarray(sent, sent + 1));
      await new Promise((r) => setTimeout(r, 200));
      if (sent === 2 && (await stillServes())) othersServed++;
    }
    expect(await closedWithin(socket, 5000)).toBe("closed");
    expect(sent).toBeLessThan(100);
    expect(othersServed).toBe(1);
    expect(Buffer.concat(received).toString()).toMatch(/^HTTP\/1\.1 408 /);
  });

  it("closes a connection that sends nothing, or less than the HTTP/2 preface, after the headers timeout", async () => {
    const silent = await connected();
    const partial = await connected();
    partial.write("PRI * HTTP/2.0\r\n");
    expect(await closedWithin(silent, 10_000)).toBe("closed");
    expect(await closedWithin(partial, 10_000)).toBe("closed");
    expect(await stillServes()).toBe(true);
  });

  it("closes an idle HTTP/1.1 keep-alive connection", async () => {
    const socket = await connected();
    socket.write("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    await once(socket, "data");
    expect(await closedWithin(socket, 10_000)).toBe("closed");
  });

  it("closes an idle HTTP/2 session, but not one with a call in progress", async () => {
    const idle = http2.connect(`http://127.0.0.1:${port}`);
    idle.on("error", () => {});
    await once(idle, "connect");
    const idleClosed = within(
      10_000,
      once(idle, "close").then(() => "closed"),
    );
    // A long poll of 3 s on another session: no frame moves while it waits,
    // yet it is not cut after the 1 s idle timeout.
    const busy = http2.connect(`http://127.0.0.1:${port}`);
    busy.on("error", () => {});
    const workerId = JSON.parse(
      (
        await h1(
          "/meshwork.v1.FleetService/RegisterWorker",
          { "content-type": "application/json" },
          JSON.stringify({ name: "w", capabilities: [uniqueWorkload("idle")] }),
        )
      ).body,
    ).workerId as string;
    const stream = busy.request({
      ":method": "POST",
      ":path": "/meshwork.v1.LeaseService/ClaimTasks",
      "content-type": "application/json",
    });
    const body: Buffer[] = [];
    stream.on("data", (c: Buffer) => body.push(c));
    stream.end(JSON.stringify({ workerId, waitSeconds: 3 }));
    const [headers] = (await once(stream, "response")) as [http2.IncomingHttpHeaders];
    await once(stream, "end");
    expect(headers[":status"]).toBe(200);
    expect(JSON.parse(Buffer.concat(body).toString())).toEqual({ freeSlots: 1, maxConcurrency: 1 });
    expect(busy.closed || busy.destroyed).toBe(false);
    expect(await idleClosed).toBe("closed");
    // Once its call is over, the busy session is idle too.
    expect(
      await within(
        10_000,
        once(busy, "close").then(() => "closed"),
      ),
    ).toBe("closed");
    idle.destroy();
    busy.destroy();
  });
});

/** An HTTP/2 frame: 24-bit length, type, flags, stream id. */
function h2Frame(type: number, flags: number, streamId: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head.writeUInt8(type, 3);
  head.writeUInt8(flags, 4);
  head.writeUInt32BE(streamId, 5);
  return Buffer.concat([head, payload]);
}

/** The HTTP/2 frames in `data` (a server's bytes: it sends no preface). */
function framesOf(data: Buffer): { type: number; streamId: number; payload: Buffer }[] {
  const frames = [];
  for (let at = 0; at + 9 <= data.length; at += 9 + data.readUIntBE(at, 3)) {
    const length = data.readUIntBE(at, 3);
    frames.push({
      type: data.readUInt8(at + 3),
      streamId: data.readUInt32BE(at + 5) & 0x7fffffff,
      payload: data.subarray(at + 9, at + 9 + length),
    });
  }
  return frames;
}

/** An HPACK literal header field without indexing, new name (RFC 7541 §6.2.2); short strings only. */
function hpackLiteral(name: string, value: string): Buffer {
  return Buffer.concat([
    Buffer.from([0x00, name.length]),
    Buffer.from(name),
    Buffer.from([value.length]),
    Buffer.from(value),
  ]);
}

describe("HTTP/2 abuse (maxConcurrentStreams 100, maxHeaderBytes 8 KiB here)", () => {
  it("advertises the stream and header limits in its SETTINGS", async () => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on("error", () => {});
    await once(session, "remoteSettings");
    expect(session.remoteSettings).toMatchObject({
      maxConcurrentStreams: 100,
      maxHeaderListSize: 8192,
    });
    session.destroy();
  });

  it("refuses the stream beyond maxConcurrentStreams on one connection, and keeps serving", async () => {
    const socket = await connected();
    const received: Buffer[] = [];
    socket.on("data", (d: Buffer) => received.push(d));
    socket.write(Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
    socket.write(h2Frame(0x4, 0, 0, Buffer.alloc(0))); // SETTINGS, empty
    await once(socket, "data"); // the server's SETTINGS
    socket.write(h2Frame(0x4, 0x1, 0, Buffer.alloc(0))); // SETTINGS ACK: its limits now bind
    // 101 requests whose bodies never come (END_HEADERS, no END_STREAM):
    // each holds a stream open. :method POST, :scheme http, then :authority,
    // :path and content-type as literals with indexed names (RFC 7541 §6.2.2).
    const block = Buffer.concat([
      Buffer.from([0x83, 0x86, 0x01, 9]),
      Buffer.from("127.0.0.1"),
      Buffer.from([0x04, 35]),
      Buffer.from("/meshwork.v1.TaskService/CreateTask"),
      Buffer.from([0x0f, 0x10, 16]),
      Buffer.from("application/json"),
    ]);
    for (let i = 0; i < 101; i++) socket.write(h2Frame(0x1, 0x4, 1 + 2 * i, block));
    const lastStream = 1 + 2 * 100;
    // Wait (bounded) for the refusal of the 101st: RST_STREAM on it, or (what
    // Node does: the client broke the limit it was told) a GOAWAY whose last
    // stream is the 100th, ending the connection.
    const refusal = await within(
      10_000,
      new Promise<{ type: number; streamId: number; payload: Buffer }>((resolve) => {
        const look = () => {
          const frame = framesOf(Buffer.concat(received)).find(
            (f) => (f.type === 0x3 && f.streamId === lastStream) || f.type === 0x7,
          );
          if (frame) resolve(frame);
        };
        socket.on("data", look);
        look();
      }),
    );
    expect(refusal).not.toBe("timed out");
    if (refusal !== "timed out" && refusal.type === 0x7) {
      expect(refusal.payload.readUInt32BE(0)).toBe(lastStream - 2);
    }
    socket.destroy();
    expect(await stillServes()).toBe(true);
  });

  it("survives a rapid reset of 5,000 streams on one session, and serves a new connection", async () => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on("error", () => {});
    await once(session, "remoteSettings");
    let goaway: number | undefined;
    session.on("goaway", (code: number) => {
      goaway = code;
    });
    const rssBefore = process.memoryUsage().rss;
    let opened = 0;
    // 50 rounds of 100 streams opened and cancelled at once, yielding to the
    // event loop between rounds so that the frames go out; stops early if
    // the server closes the session (it may: that is the defence).
    for (let round = 0; round < 50 && !session.closed && !session.destroyed; round++) {
      for (let i = 0; i < 100; i++) {
        try {
          const stream = session.request({
            ":method": "POST",
            ":path": "/meshwork.v1.TaskService/CreateTask",
            "content-type": "application/json",
          });
          stream.on("error", () => {});
          stream.close(http2.constants.NGHTTP2_CANCEL);
          opened++;
        } catch {
          break; // the session is going away
        }
      }
      await new Promise((r) => setImmediate(r));
    }
    // nghttp2's rapid-reset defence (CVE-2023-44487) ended the session with
    // a GOAWAY long before the 5,000th stream.
    expect(goaway).toBeDefined();
    expect(opened).toBeLessThan(5000);
    session.destroy();
    expect(await stillServes()).toBe(true);
    // A bound, not a measurement (the server is in this process).
    expect(process.memoryUsage().rss - rssBefore).toBeLessThan(50 * MiB);
  });

  it("closes a connection that floods CONTINUATION frames, and serves a new one", async () => {
    const socket = await connected();
    const received: Buffer[] = [];
    socket.on("data", (d: Buffer) => received.push(d));
    const rssBefore = process.memoryUsage().rss;
    socket.write(Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
    socket.write(h2Frame(0x4, 0, 0, Buffer.alloc(0))); // SETTINGS, empty
    // HEADERS (no END_HEADERS): :method POST, :scheme http, :path /, then
    // CONTINUATION frames without END_HEADERS, each one more header field.
    socket.write(h2Frame(0x1, 0, 1, Buffer.from([0x83, 0x86, 0x84])));
    let frames = 0;
    for (; frames < 10_000 && !socket.destroyed && !socket.writableEnded; frames++) {
      const more = h2Frame(0x9, 0, 1, hpackLiteral(`x-flood-${frames % 100}`, "v".repeat(50)));
      if (!socket.write(more)) {
        const drained = await within(
          5000,
          new Promise((resolve) => {
            socket.once("drain", resolve);
            socket.once("close", resolve);
          }),
        );
        if (drained === "timed out") break;
      }
      if (frames % 100 === 0) await new Promise((r) => setImmediate(r));
    }
    expect(await closedWithin(socket, 10_000)).toBe("closed");
    // It was the server that ended it, with a GOAWAY (nghttp2 accepts only a
    // few CONTINUATION frames per header block: CVE-2024-27983).
    expect(framesOf(Buffer.concat(received)).map((f) => f.type)).toContain(0x7);
    expect(frames).toBeLessThan(10_000);
    expect(await stillServes()).toBe(true);
    expect(process.memoryUsage().rss - rssBefore).toBeLessThan(50 * MiB);
  });

  it("answers an HTTP/1.1 header block above the limit with 431, and keeps serving", async () => {
    const tasksBefore = await taskCount();
    const big = await h1(
      "/meshwork.v1.TaskService/CreateTask",
      { "content-type": "application/json", "x-big": "a".repeat(10_000) },
      `{"workload":"${uniqueWorkload("hdr")}"}`,
    );
    expect(big.status).toBe(431);
    expect(await taskCount()).toBe(tasksBefore);
    expect(await stillServes()).toBe(true);
  });

  it("refuses an HTTP/2 header block above the limit before any handler runs, and keeps serving", async () => {
    const tasksBefore = await taskCount();
    const big = await h2(
      grpcHeaders("TaskService/CreateTask", { "x-big": "a".repeat(10_000) }),
      grpcFrame(Buffer.alloc(0), false),
      true,
    );
    // nghttp2 resets the stream (ENHANCE_YOUR_CALM) once the client has
    // acknowledged the SETTINGS; the listener does the same before that.
    expect(big).toMatchObject({ headers: {}, rstCode: http2.constants.NGHTTP2_ENHANCE_YOUR_CALM });
    const early = await h2(
      grpcHeaders("TaskService/CreateTask", { "x-big": "a".repeat(10_000) }),
      grpcFrame(Buffer.alloc(0), false),
    );
    expect(early).toMatchObject({
      headers: {},
      rstCode: http2.constants.NGHTTP2_ENHANCE_YOUR_CALM,
    });
    // Just under the limit passes (the handler runs: workload is required).
    const under = await h2(
      grpcHeaders("TaskService/CreateTask", { "x-big": "a".repeat(7000) }),
      grpcFrame(Buffer.alloc(0), false),
    );
    expect(grpcStatus(under)).toBe("3");
    expect(await taskCount()).toBe(tasksBefore);
    expect(await stillServes()).toBe(true);
  });
});

describe("the same limits with TLS (HTTP/2 or HTTP/1.1 by ALPN)", () => {
  let tlsServer: RunningServer;
  let tlsPort: number;
  let ca: Buffer;
  beforeAll(async () => {
    const { cert, key } = selfSignedCert("meshwork-limits-tls-");
    ca = readFileSync(cert);
    tlsServer = await listen(
      appOn(tdb.database, { ...limits, tlsCert: cert, tlsKey: key }),
      "127.0.0.1:0",
    );
    tlsPort = tlsServer.port;
  });
  afterAll(async () => {
    await tlsServer?.close();
  });

  async function tlsConnected(alpn: string): Promise<tls.TLSSocket> {
    const socket = tls.connect({ host: "127.0.0.1", port: tlsPort, ca, ALPNProtocols: [alpn] });
    socket.on("error", () => {});
    await once(socket, "secureConnect");
    return socket;
  }

  it("advertises the HTTP/2 limits and closes an idle session", async () => {
    const session = http2.connect(tlsServer.url, { ca });
    session.on("error", () => {});
    await once(session, "remoteSettings");
    expect(session.remoteSettings).toMatchObject({
      maxConcurrentStreams: 100,
      maxHeaderListSize: 8192,
    });
    expect(
      await within(
        10_000,
        once(session, "close").then(() => "closed"),
      ),
    ).toBe("closed");
    session.destroy();
  });

  it("cuts off a slow HTTP/1.1 client with 408, and refuses large headers with 431", async () => {
    const slow = await tlsConnected("http/1.1");
    const received: Buffer[] = [];
    slow.on("data", (d: Buffer) => received.push(d));
    const request = Buffer.from(
      `GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ${"a".repeat(200)}\r\n\r\n`,
    );
    for (let sent = 0; sent < 100 && !slow.closed && !slow.destroyed; sent++) {
      slow.write(request.subarray(sent, sent + 1));
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(await closedWithin(slow, 5000)).toBe("closed");
    expect(Buffer.concat(received).toString()).toMatch(/^HTTP\/1\.1 408 /);
    const big = await tlsConnected("http/1.1");
    const answer: Buffer[] = [];
    big.on("data", (d: Buffer) => answer.push(d));
    big.write(`GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${"a".repeat(10_000)}\r\n\r\n`);
    expect(await closedWithin(big, 5000)).toBe("closed");
    expect(Buffer.concat(answer).toString()).toMatch(/^HTTP\/1\.1 431 /);
  });

  it("closes a connection that never starts the TLS handshake", async () => {
    const socket = net.connect(tlsPort, "127.0.0.1");
    socket.on("error", () => {});
    await once(socket, "connect");
    expect(await closedWithin(socket, 10_000)).toBe("closed");
  });
});
