import { once } from "node:events";
import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService, type StreamLeasesRequest } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { TokenService } from "../../gen/meshwork/v1/token_pb.js";
import type { App } from "../../src/app.js";
import { listen, type RunningServer } from "../../src/server.js";
import { until, within } from "../support/bounded.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { appOn, uniqueWorkload } from "../support/harness.js";

/**
 * What a client without a valid token can make the coordinator do, and the
 * bounds on clients that hold what they opened: a coordinator with auth on
 * and tight limits. The "attacker" connects from 127.0.0.2 (loopback too),
 * so that the coordinator counts it as a source apart from the tests'
 * clients on 127.0.0.1.
 */
const attacker = "127.0.0.2";
const limits = {
  auth: "on" as const,
  bodyTimeoutMs: 1000,
  authFailureRate: 1,
  authFailureBurst: 5,
  maxConcurrentStreams: 100,
};

let tdb: TestDatabase;
let app: App;
let server: RunningServer;
let port: number;
let admin = "";
let worker = "";
const logLines: string[] = [];

beforeAll(async () => {
  tdb = await createTestDatabase();
  app = appOn(tdb.database, limits);
  // The app's log as lines, to read what a flood wrote.
  const log = app.log as unknown as { info: (...a: unknown[]) => void };
  const info = log.info.bind(log);
  log.info = (...a: unknown[]) => {
    logLines.push(JSON.stringify(a));
    info(...a);
  };
  admin = (await app.tokens.create("door-admin", "admin")).secret;
  worker = (await app.tokens.create("door-worker", "worker")).secret;
  server = await listen(app, "127.0.0.1:0");
  port = server.port;
});
afterAll(async () => {
  await server?.close();
  await tdb?.drop();
});

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

/** A raw TCP connection from `from`, with everything it received. */
const raw = (from = "127.0.0.1") => rawTo(port, from);
async function rawTo(to: number, from: string) {
  const socket = net.connect({ host: "127.0.0.1", port: to, localAddress: from });
  socket.on("error", () => {});
  let received = Buffer.alloc(0);
  socket.on("data", (d: Buffer) => {
    received = Buffer.concat([received, d]);
  });
  const closed = once(socket, "close").then(() => true);
  await once(socket, "connect");
  return {
    socket,
    closed,
    text: () => received.toString("latin1"),
  };
}

/** An h2c session from `from`. */
function session(from = "127.0.0.1") {
  const s = http2.connect(`http://127.0.0.1:${port}`, {
    createConnection: () => net.connect({ host: "127.0.0.1", port, localAddress: from }),
  });
  s.on("error", () => {});
  return s;
}

/** A stream's answer: status, headers, trailers, body and how it closed. */
function answerOf(stream: http2.ClientHttp2Stream) {
  return new Promise<{
    headers: http2.IncomingHttpHeaders;
    trailers: http2.IncomingHttpHeaders;
    body: string;
    rstCode: number;
  }>((resolve) => {
    let headers: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    stream.on("response", (h) => {
      headers = h;
    });
    stream.on("trailers", (t) => {
      trailers = t;
    });
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("error", () => {});
    stream.on("close", () =>
      resolve({
        headers,
        trailers,
        body: Buffer.concat(chunks).toString(),
        rstCode: stream.rstCode ?? 0,
      }),
    );
  });
}

describe("a request without a valid token is answered from its headers", () => {
  it("HTTP/2: a Connect call whose body never comes gets 401 at once and its stream reset", async () => {
    const s = session();
    try {
      const stream = s.request({
        ":method": "POST",
        ":path": "/meshwork.v1.TaskService/CreateTask",
        "content-type": "application/json",
      });
      // Headers only: the body is never sent and the stream never ended.
      const answer = await within(10_000, answerOf(stream));
      expect(answer).not.toBe("timed out");
      if (answer === "timed out") return;
      expect(answer.headers[":status"]).toBe(401);
      expect(JSON.parse(answer.body)).toMatchObject({ code: "unauthenticated" });
      expect(answer.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
    } finally {
      s.close();
    }
  });

  it("gRPC: grpc-status 16 in the trailers, before any message is sent", async () => {
    const s = session();
    try {
      const stream = s.request({
        ":method": "POST",
        ":path": "/meshwork.v1.LeaseService/StreamLeases",
        "content-type": "application/grpc",
        te: "trailers",
      });
      const answer = await within(10_000, answerOf(stream));
      expect(answer).not.toBe("timed out");
      if (answer === "timed out") return;
      expect(answer.headers[":status"]).toBe(200);
      expect(answer.trailers["grpc-status"]).toBe("16");
    } finally {
      s.close();
    }
  });

  it("HTTP/1.1: a declared body of 100,000 bytes, of which one arrived, gets its 401 at once", async () => {
    const c = await raw();
    c.socket.write(
      "POST /meshwork.v1.TaskService/CreateTask HTTP/1.1\r\nHost: x\r\n" +
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
    );
    await until(() => c.text().includes("\r\n\r\n"), 10_000);
    expect(c.text()).toMatch(/^HTTP\/1\.1 401 /);
    // The rest of the body is not waited for: the connection is let go.
    expect(await within(15_000, c.closed)).toBe(true);
  });

  it("the plain routes too: an upload without a token is refused before its body", async () => {
    const c = await raw();
    c.socket.write(
      "PUT /tasks/00000000-0000-4000-8000-000000000000/artifacts/a.bin HTTP/1.1\r\nHost: x\r\n" +
        "Content-Length: 1000000\r\n\r\nabc",
    );
    await until(() => c.text().includes("\r\n\r\n"), 10_000);
    expect(c.text()).toMatch(/^HTTP\/1\.1 401 /);
    c.socket.destroy();
  });
});

describe("a body that stops", () => {
  it("HTTP/1.1 with a valid token: 408 and the connection closed once no byte came for the body timeout", async () => {
    const c = await raw();
    c.socket.write(
      "POST /meshwork.v1.TaskService/CreateTask HTTP/1.1\r\nHost: x\r\n" +
        `Authorization: Bearer ${admin}\r\n` +
        "Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{",
    );
    expect(await within(15_000, c.closed)).toBe(true);
    expect(c.text()).toMatch(/^HTTP\/1\.1 408 /);
    expect(c.text()).toContain('"code":"deadline_exceeded"');
  });

  it("HTTP/2 with a valid token: the stream is reset, the session serves on", async () => {
    const s = session();
    try {
      const stream = s.request({
        ":method": "POST",
        ":path": "/meshwork.v1.TaskService/CreateTask",
        "content-type": "application/json",
        ...bearer(admin),
      });
      stream.write("{");
      const answer = await within(15_000, answerOf(stream));
      expect(answer).not.toBe("timed out");
      if (answer === "timed out") return;
      expect(answer.rstCode).toBe(http2.constants.NGHTTP2_CANCEL);
      const next = s.request({ ":method": "GET", ":path": "/healthz" });
      next.end();
      expect((await answerOf(next)).headers[":status"]).toBe(200);
    } finally {
      s.close();
    }
  });

  it("a bidi stream may rest between messages for longer than the body timeout", async () => {
    const transport = createGrpcTransport({
      baseUrl: server.url,
      interceptors: [
        (next) => (req) => {
          req.header.set("authorization", `Bearer ${worker}`);
          return next(req);
        },
      ],
    });
    const fleet = createClient(FleetService, transport);
    const leases = createClient(LeaseService, transport);
    const { workerId } = await fleet.registerWorker({ capabilities: [uniqueWorkload()] });
    const queue: StreamLeasesRequest[] = [];
    let wake: (() => void) | undefined;
    async function* requests() {
      for (;;) {
        while (queue.length === 0) await new Promise<void>((r) => (wake = r));
        const next = queue.shift();
        if (!next) return;
        yield next;
      }
    }
    const push = (m: Partial<StreamLeasesRequest>) => {
      queue.push(m as StreamLeasesRequest);
      wake?.();
    };
    const abort = new AbortController();
    const responses = leases
      .streamLeases(requests(), { signal: abort.signal })
      [Symbol.asyncIterator]();
    push({ workerId });
    expect((await responses.next()).done).toBe(false);
    await new Promise((r) => setTimeout(r, 2500)); // 2.5 × the body timeout
    push({ workerId });
    const second = await within(10_000, responses.next());
    expect(second).not.toBe("timed out");
    expect((second as IteratorResult<unknown>).done).toBe(false);
    abort.abort();
  });
});

describe("failed authentications per source", () => {
  it("past the burst: 429 with Retry-After, no lookup; a valid token from there still passes; another source is untouched", async () => {
    const statusFrom = (from: string, token?: string) =>
      new Promise<{ status: number; retryAfter: string | undefined }>((resolve, reject) => {
        const req = http.request(
          {
            host: "127.0.0.1",
            port,
            method: "POST",
            path: "/meshwork.v1.TaskService/ListTasks",
            localAddress: from,
            agent: false,
            headers: { "content-type": "application/json", ...(token ? bearer(token) : {}) },
          },
          (res) => {
            res.resume();
            res.on("end", () =>
              resolve({
                status: res.statusCode ?? 0,
                retryAfter: res.headers["retry-after"] as string | undefined,
              }),
            );
          },
        );
        req.on("error", reject);
        req.end("{}");
      });
    // A token valid before the flood is known to the coordinator.
    expect((await statusFrom("127.0.0.3", admin)).status).toBe(200);
    // Ten different unknown tokens, as a flood of guesses would send: each
    // needs a lookup of its own (requests with one digest would share one
    // lookup, and its answer, at no further cost). Each lookup is charged to
    // the source before it runs, so 401 here means a lookup was made. The
    // source's bucket holds 5 and refills one a second (limits above), and
    // each 429 is held a second before it is answered (the tarpit), so the
    // ten take a second at least, more on a loaded machine: each second
    // lets one more through to a lookup.
    const guesses = Array.from({ length: 10 }, (_, i) => `mw_${"Z".repeat(42)}${"ABCDEFGHIJ"[i]}`);
    const sent = performance.now();
    const answers = await Promise.all(guesses.map((guess) => statusFrom("127.0.0.3", guess)));
    const refilled = Math.floor((performance.now() - sent) / 1000) * limits.authFailureRate;
    const statuses = answers.map((a) => a.status);
    const looked = statuses.filter((s) => s === 401).length;
    expect(statuses.filter((s) => s !== 401 && s !== 429)).toEqual([]);
    expect(looked).toBeGreaterThanOrEqual(5);
    expect(looked).toBeLessThanOrEqual(Math.min(10, 5 + refilled));
    for (const a of answers.filter((x) => x.status === 429)) {
      expect(a.retryAfter).toMatch(/^\d+$/);
    }
    expect((await statusFrom("127.0.0.3", admin)).status).toBe(200);
    expect((await statusFrom("127.0.0.1", guesses[0])).status).toBe(401);
    // Logged with the address, and not once per request.
    const lines = logLines.filter((l) => l.includes("127.0.0.3"));
    expect(lines.length).toBeGreaterThan(0);
    expect(lines.length).toBeLessThan(4);
  });

  it("an HTTP/2 connection that only keeps failing once throttled is closed", async () => {
    const s = session(attacker);
    const closed = new Promise<boolean>((resolve) => s.on("close", () => resolve(true)));
    try {
      for (let i = 0; i < 60 && !s.destroyed && !s.closed; i++) {
        const stream = s.request({
          ":method": "POST",
          ":path": "/meshwork.v1.TaskService/ListTasks",
          "content-type": "application/json",
        });
        stream.on("error", () => {});
        stream.end("{}");
      }
    } catch {
      // The session was told to go away while this loop opened streams.
    }
    expect(await within(20_000, closed)).toBe(true);
  });
});

describe("connections per source", () => {
  let capped: RunningServer;
  beforeAll(async () => {
    capped = await listen(
      appOn(tdb.database, { ...limits, maxConnectionsPerSource: 4 }),
      "127.0.0.1:0",
    );
  });
  afterAll(() => capped?.close());

  it("closes a connection beyond the cap before reading from it; other sources connect", async () => {
    const raw = (from: string) => rawTo(capped.port, from);
    const held = await Promise.all([1, 2, 3, 4].map(() => raw("127.0.0.4")));
    const fifth = await raw("127.0.0.4");
    expect(await within(10_000, fifth.closed)).toBe(true);
    const other = await raw("127.0.0.5");
    other.socket.write("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    await until(() => other.text().includes("\r\n\r\n"), 10_000);
    expect(other.text()).toMatch(/^HTTP\/1\.1 200 /);
    for (const c of [...held, other]) c.socket.destroy();
    // Once closed, they no longer count.
    await until(async () => {
      const again = await raw("127.0.0.4");
      again.socket.write("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
      const ok = await within(
        2000,
        until(() => again.text().includes("200"), 2000).then(() => true),
      ).catch(() => false);
      again.socket.destroy();
      return ok === true;
    }, 10_000);
  });
});

describe("revocation", () => {
  it("ends a revoked token's open StreamLeases and WatchTask with unauthenticated", async () => {
    const { secret: workerSecret } = await app.tokens.create("soon-gone-worker", "worker");
    const { secret: clientSecret } = await app.tokens.create("soon-gone-client", "client");
    const as = (token: string) =>
      createConnectTransport({
        baseUrl: server.url,
        httpVersion: "2",
        interceptors: [
          (next) => (req) => {
            req.header.set("authorization", `Bearer ${token}`);
            return next(req);
          },
        ],
      });
    const workload = uniqueWorkload();
    const { workerId } = await createClient(FleetService, as(workerSecret)).registerWorker({
      capabilities: [workload],
    });
    const { task } = await createClient(TaskService, as(admin)).createTask({ workload });
    const leases = createClient(LeaseService, as(workerSecret));
    const { claims } = await leases.claimTasks({ workerId, maxTasks: 1 });
    const claim = claims[0];
    if (!claim || !task) throw new Error("no claim");

    const renewals = (async function* () {
      for (;;) {
        yield {
          workerId,
          leases: [{ taskId: claim.taskId, attempt: claim.attempt, leaseToken: claim.leaseToken }],
        } as StreamLeasesRequest;
        await new Promise((r) => setTimeout(r, 200));
      }
    })();
    const streamEnd = outcome(
      (async () => {
        for await (const _ of leases.streamLeases(renewals));
      })(),
    );
    const watchEnd = outcome(
      (async () => {
        for await (const _ of createClient(TaskService, as(clientSecret)).watchTask({
          taskId: task.taskId,
        }));
      })(),
    );
    await new Promise((r) => setTimeout(r, 500));
    const tokens = createClient(TokenService, as(admin));
    await tokens.revokeToken({ name: "soon-gone-worker" });
    await tokens.revokeToken({ name: "soon-gone-client" });
    const [stream, watch] = await Promise.all([
      within(10_000, streamEnd),
      within(10_000, watchEnd),
    ]);
    expect(stream).toMatchObject({ code: "Unauthenticated" });
    expect(watch).toMatchObject({ code: "Unauthenticated" });
  });
});
