/**
 * Property tests (fast-check) that send hostile input to a real coordinator
 * listening on 127.0.0.1 with auth on, over every protocol it serves, and
 * check that every answer is well formed and leaks nothing.
 *
 * Targets: every RPC of the eight meshwork.v1 services (from the generated
 * descriptors), every plain HTTP route (random ids, file names, methods and
 * headers) and a few random paths.
 *
 * What "leaks nothing" means, and how false positives are avoided: the
 * forbidden fragments (SQL, driver names, stack frames, paths, token secrets)
 * are checked in every answer's status line, headers, trailers and body. The
 * inputs the generators draw from never contain those fragments, so stored
 * data (a task's workload, a knowledge entry) cannot bring one back in a
 * later successful answer. A fragment is excused in one answer only when that
 * very request contained it (an error may quote the caller's own input, e.g.
 * an x-correlation-id or a malformed id); token secrets are never excused
 * (they are sent only in Authorization, which no answer may echo). A
 * CreateToken that succeeds legitimately returns a new secret: it is
 * remembered, and from then on checked for in every answer and in the log.
 *
 * Well formed: a status from the list below (never 500); Connect errors are
 * JSON {code, message} with a Connect code; gRPC and gRPC-Web carry a
 * grpc-status 0–16; Connect streams end with an end-stream message; plain
 * routes answer errors with JSON {error, message}. `internal`, `unknown`,
 * `data_loss` and grpc-status 2, 13, 15 count as 500s. Protocol answers that
 * no Meshwork code writes are allowed where they are the protocol's answer:
 * 405 for another method than POST on an RPC path, 505 for a bidi stream
 * over HTTP/1.1, an empty 415 from Connect's router, an empty 400 from
 * Node's HTTP parser (connection: close), 416 with Content-Range and no body.
 * Every request is bounded by a guard (a hang detector, not a speed
 * assertion); the long polls and streams that may legitimately stay open
 * (WatchTask, ClaimTasks with wait_seconds, StreamLeases) are cut by it
 * without failing. Afterwards: healthz, readyz and an authenticated RPC still
 * work, and the log holds no secret, no statement parameter and no entry at
 * level error (every unexpected error is logged there).
 *
 * Seeds: FUZZ_SEED=<n> replays a run (every property uses it); fast-check
 * prints the seed and path of any failure. A summary of what the inputs
 * reached is printed at the end.
 */

import { realpathSync } from "node:fs";
import * as http from "node:http";
import * as http2 from "node:http2";
import { gzipSync } from "node:zlib";
import {
  type DescEnum,
  type DescField,
  type DescMessage,
  type DescMethod,
  fromJson,
  type JsonValue,
  ScalarType,
  toBinary,
} from "@bufbuild/protobuf";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { ConcurrencyService } from "../../gen/meshwork/v1/concurrency_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { KnowledgeService } from "../../gen/meshwork/v1/knowledge_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { ScheduleService } from "../../gen/meshwork/v1/schedule_pb.js";
import { ShareService } from "../../gen/meshwork/v1/share_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { createApp } from "../../src/app.js";
import { policy } from "../../src/auth/policy.js";
import { createLogger } from "../../src/log.js";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { testConfig } from "../support/harness.js";

// ---------------------------------------------------------------------------
// Run size and bounds

const seed = process.env.FUZZ_SEED ? Number(process.env.FUZZ_SEED) : undefined;
const runs = { json: 300, binary: 300, grpc: 300, plain: 300 };
/** Hang detectors: a request not answered by then fails (or, for a long poll, is cut). */
const guardMs = 8_000;
const waitGuardMs = 2_000;
const propertyTimeoutMs = 240_000;

// ---------------------------------------------------------------------------
// Targets

const services = [
  FleetService,
  TaskService,
  LeaseService,
  ArtifactService,
  KnowledgeService,
  TokenService,
  ShareService,
  ConcurrencyService,
  ScheduleService,
];

/** RPCs that may legitimately keep a request open (long poll, watch, bidi stream). */
const mayWait = new Set([
  "meshwork.v1.TaskService/WatchTask",
  "meshwork.v1.LeaseService/ClaimTasks",
  "meshwork.v1.LeaseService/StreamLeases",
]);

interface Target {
  /** e.g. meshwork.v1.FleetService/GetWorker */
  name: string;
  method: DescMethod;
  streaming: boolean;
}

const targets: Target[] = services.flatMap((s) =>
  s.methods.map((m) => ({
    name: `${s.typeName}/${m.name}`,
    method: m,
    streaming: m.methodKind !== "unary",
  })),
);

// ---------------------------------------------------------------------------
// What an answer may be

const allowedStatuses = new Set([
  200, 201, 204, 206, 304, 400, 401, 403, 404, 408, 409, 413, 415, 416, 429, 431, 499, 501, 503,
  504,
]);

const connectCodes = new Set([
  "canceled",
  "unknown",
  "invalid_argument",
  "deadline_exceeded",
  "not_found",
  "already_exists",
  "permission_denied",
  "resource_exhausted",
  "failed_precondition",
  "aborted",
  "out_of_range",
  "unimplemented",
  "internal",
  "unavailable",
  "data_loss",
  "unauthenticated",
]);

/** Codes that mean an unexpected error (the 500 of Connect and gRPC): always a bug here. */
const unexpectedCodes = new Set(["internal", "unknown", "data_loss"]);
const unexpectedGrpcStatuses = new Set([2, 13, 15]);

/** Fragments no answer may contain; `exact` ones are compared case-sensitively. */
const forbidden: { text: string; exact?: boolean }[] = [
  { text: "select " },
  { text: "insert into" },
  { text: "update tasks" },
  { text: "drizzle" },
  { text: "postgres" },
  { text: "pglite" },
  { text: "Error:", exact: true },
  { text: "    at " },
  { text: "/work/" },
  { text: "node_modules" },
];

const secretPattern = /mw_[A-Za-z0-9_-]{43}/g;

// ---------------------------------------------------------------------------
// The server, its log and the state the inputs may name

const logLines: string[] = [];
const live = {
  url: "",
  port: 0,
  tokens: { admin: "", client: "", worker: "", revoked: "" },
  /** Every secret known to exist: the four above and any a fuzzed CreateToken made. */
  secrets: new Set<string>(),
  /** Ids of real rows, so that some inputs reach past "not found". */
  ids: ["", "", ""] as string[],
  /** Fragments of this run that must never be shown (blob dir, database name). */
  private: [] as string[],
};

let tdb: TestDatabase;
let server: RunningServer;
let session: http2.ClientHttp2Session | undefined;
const sessionErrors: string[] = [];
const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });

/**
 * What went to console.error meanwhile: connect-node reports there a handler
 * that failed outside the RPC's own error handling (its call is then left
 * unanswered).
 */
const consoleErrors: string[] = [];
const consoleError = console.error;

async function setUp(): Promise<void> {
  console.error = (...args: unknown[]) => {
    consoleErrors.push(args.map(String).join(" ").slice(0, 2000));
    consoleError(...args);
  };
  tdb = await createTestDatabase();
  const config = testConfig({ auth: "on" });
  const sink = {
    write(line: string) {
      logLines.push(line);
    },
  };
  const app = createApp(tdb.database, config, createLogger("debug", sink));
  for (const role of ["admin", "client", "worker"] as const) {
    live.tokens[role] = (await app.tokens.create(`fuzz-${role}`, role)).secret;
  }
  live.tokens.revoked = (await app.tokens.create("fuzz-revoked", "client")).secret;
  await app.tokens.revoke({ name: "fuzz-revoked" });
  for (const s of Object.values(live.tokens)) live.secrets.add(s);
  server = await listen(app, "127.0.0.1:0");
  live.url = server.url;
  live.port = server.port;
  live.private.push(config.blobDir, realpathSync(config.blobDir), "memory://");
  if (tdb.url) {
    const u = new URL(tdb.url);
    live.private.push(tdb.url, u.pathname.slice(1));
  }

  // A worker, a finished task and its result artifact: real ids for the inputs.
  const worker = live.tokens.worker;
  const { workerId } = (await rpc(worker, "FleetService/RegisterWorker", {
    capabilities: ["fuzz"],
  })) as { workerId: string };
  await rpc(live.tokens.client, "TaskService/CreateTask", { workload: "fuzz" });
  const { claims } = (await rpc(worker, "LeaseService/ClaimTasks", {
    worker_id: workerId,
  })) as { claims: { taskId: string; attempt: number; leaseToken: string }[] };
  const claim = claims[0];
  if (!claim) throw new Error("the setup task was not claimed");
  const put = await fetch(`${live.url}/tasks/${claim.taskId}/artifacts/result.txt`, {
    method: "PUT",
    headers: {
      authorization: `Bearer ${worker}`,
      "x-worker-id": workerId,
      "x-task-attempt": String(claim.attempt),
      "x-lease-token": claim.leaseToken,
      "content-type": "text/plain",
    },
    body: "fuzz result bytes\n".repeat(20),
  });
  const ref = (await put.json()) as {
    artifact_id: string;
    uri: string;
    sha256: string;
    size_bytes: number;
  };
  await rpc(worker, "LeaseService/CompleteTask", {
    task_id: claim.taskId,
    worker_id: workerId,
    attempt: claim.attempt,
    lease_token: claim.leaseToken,
    result: {
      artifact_id: ref.artifact_id,
      uri: ref.uri,
      sha256: ref.sha256,
      size_bytes: ref.size_bytes,
    },
  });
  live.ids = [workerId, claim.taskId, ref.artifact_id];
}

/** A Connect JSON call that must succeed (setup and final checks). */
async function rpc(token: string, path: string, body: unknown): Promise<unknown> {
  const res = await fetch(`${live.url}/meshwork.v1.${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: JSON.stringify(body),
  });
  const json = (await res.json()) as unknown;
  if (res.status !== 200) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
  return json;
}

function h2(): http2.ClientHttp2Session {
  if (session && !session.destroyed && !session.closed) return session;
  if (session) sessionErrors.push("the HTTP/2 session was closed by the server");
  // The client's own session memory (Node's default: 10 MB) must hold the
  // largest body queued at once, or the client refuses its own stream.
  const s = http2.connect(live.url, { maxSessionMemory: 64 });
  s.on("error", (e) => sessionErrors.push(`session error: ${String(e)}`));
  s.on("goaway", (code) => sessionErrors.push(`GOAWAY ${code}`));
  session = s;
  return s;
}

// ---------------------------------------------------------------------------
// Sending

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  trailers: Record<string, string | string[] | undefined>;
  body: Buffer;
  /** Cut by the guard. */
  cut: boolean;
  /** The client saw an error (reset, hang-up) instead of a complete answer. */
  error: string | undefined;
}

interface Sent {
  protocol: "connect-json" | "binary" | "grpc" | "plain";
  /** Over the HTTP/2 session (gRPC always; Connect and gRPC-Web sometimes). */
  h2?: boolean;
  target?: Target;
  method: string;
  path: string;
  headers: Record<string, string>;
  body: Buffer;
  chunked?: boolean;
}

function send(req: Sent): Promise<Answer> {
  const guard = req.target && mayWait.has(req.target.name) ? waitGuardMs : guardMs;
  return req.h2 ? sendH2(req, guard) : sendH1(req, guard, true);
}

function sendH1(req: Sent, guard: number, retry: boolean): Promise<Answer> {
  return new Promise((resolve) => {
    const answer: Answer = {
      status: 0,
      headers: {},
      trailers: {},
      body: Buffer.alloc(0),
      cut: false,
      error: undefined,
    };
    const chunks: Buffer[] = [];
    let settled = false;
    const finish = () => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      answer.body = Buffer.concat(chunks);
      resolve(answer);
    };
    const r = http.request({
      host: "127.0.0.1",
      port: live.port,
      method: req.method,
      path: req.path,
      headers: req.headers,
      agent,
    });
    const timer = setTimeout(() => {
      answer.cut = true;
      r.destroy();
      finish();
    }, guard);
    r.on("response", (res) => {
      answer.status = res.statusCode ?? 0;
      answer.headers = res.headers;
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        answer.trailers = res.trailers;
        finish();
      });
      res.on("error", (e) => {
        answer.error ??= String(e);
        finish();
      });
      res.on("aborted", () => {
        answer.error ??= "response aborted";
      });
    });
    r.on("error", (e: NodeJS.ErrnoException) => {
      if (settled) return;
      // A kept-alive socket the server closed between two requests: not an answer, retry once.
      if (retry && answer.status === 0 && r.reusedSocket && e.code === "ECONNRESET") {
        settled = true;
        clearTimeout(timer);
        sendH1(req, guard, false).then(resolve);
        return;
      }
      answer.error ??= `${e.code ?? ""} ${e.message}`;
      if (answer.status === 0) finish();
    });
    if (req.chunked && req.body.length > 1) {
      const half = req.body.length >> 1;
      r.write(req.body.subarray(0, half));
      r.end(req.body.subarray(half));
    } else if (req.body.length > 0 || !["GET", "HEAD"].includes(req.method)) {
      r.end(req.body);
    } else {
      r.end();
    }
  });
}

function sendH2(req: Sent, guard: number): Promise<Answer> {
  return new Promise((resolve) => {
    const answer: Answer = {
      status: 0,
      headers: {},
      trailers: {},
      body: Buffer.alloc(0),
      cut: false,
      error: undefined,
    };
    const chunks: Buffer[] = [];
    const s = h2().request({ ":method": req.method, ":path": req.path, ...req.headers });
    const timer = setTimeout(() => {
      answer.cut = true;
      s.close(http2.constants.NGHTTP2_CANCEL);
    }, guard);
    s.on("response", (h) => {
      answer.status = Number(h[":status"]);
      answer.headers = h;
    });
    s.on("trailers", (t) => {
      answer.trailers = t;
    });
    s.on("data", (c: Buffer) => chunks.push(c));
    s.on("error", (e) => {
      answer.error ??= String(e);
    });
    let ended = false;
    // A server may answer before it has read the whole request (a body over
    // its limit): the answer is complete when its side of the stream ends,
    // and the client then stops sending, as gRPC clients do.
    s.on("end", () => {
      ended = true;
      // Only when the request is still being sent; otherwise the stream
      // closes by itself.
      if (!s.closed && !s.writableFinished) s.close(http2.constants.NGHTTP2_CANCEL);
    });
    s.on("close", () => {
      clearTimeout(timer);
      if (!answer.cut && !ended && s.rstCode !== http2.constants.NGHTTP2_NO_ERROR) {
        answer.error ??= `stream reset with code ${s.rstCode}`;
      }
      answer.body = Buffer.concat(chunks);
      resolve(answer);
    });
    s.end(req.body);
  });
}

// ---------------------------------------------------------------------------
// Checking

/** Connect (and gRPC-Web) envelopes: flags, 4-byte big-endian length, payload. */
function envelopes(body: Buffer): { flags: number; data: Buffer }[] | "malformed" {
  const out: { flags: number; data: Buffer }[] = [];
  let at = 0;
  while (at < body.length) {
    if (body.length - at < 5) return "malformed";
    const flags = body.readUInt8(at);
    const size = body.readUInt32BE(at + 1);
    if (body.length - at - 5 < size) return "malformed";
    out.push({ flags, data: body.subarray(at + 5, at + 5 + size) });
    at += 5 + size;
  }
  return out;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function headerValue(h: Answer["headers"], name: string): string {
  const v = h[name];
  return (Array.isArray(v) ? v[0] : v) ?? "";
}

function flatten(h: Answer["headers"]): string {
  return Object.entries(h)
    .map(([k, v]) => `${k}: ${Array.isArray(v) ? v.join(", ") : (v ?? "")}`)
    .join("\n");
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/** A Connect error object ({code, message}) as the protocol defines it. */
function connectErrorProblems(e: unknown, where: string): string[] {
  if (!isRecord(e)) return [`${where}: not a JSON object`];
  const problems: string[] = [];
  if (typeof e.code !== "string" || !connectCodes.has(e.code)) {
    problems.push(`${where}: code ${JSON.stringify(e.code)} is not a Connect code`);
  } else if (unexpectedCodes.has(e.code)) {
    problems.push(`${where}: code ${e.code} (an unexpected error)`);
  }
  if (typeof e.message !== "string") problems.push(`${where}: message is not a string`);
  return problems;
}

/** grpc-status (header or trailer) is a number 0–16 and not an unexpected error. */
function grpcStatusProblems(raw: string | undefined, where: string): string[] {
  if (raw === undefined || raw === "") return [`${where}: no grpc-status`];
  if (!/^\d{1,2}$/.test(raw) || Number(raw) > 16) return [`${where}: grpc-status ${raw}`];
  if (unexpectedGrpcStatuses.has(Number(raw))) return [`${where}: grpc-status ${raw} (unexpected)`];
  return [];
}

/** The text everything leak-related is searched in, and what the request itself contained. */
function leakProblems(answer: Answer, sent: Sent, mayHoldNewSecret: boolean): string[] {
  const text = [
    String(answer.status),
    flatten(answer.headers),
    flatten(answer.trailers),
    safeDecode(headerValue(answer.headers, "grpc-message")),
    safeDecode(headerValue(answer.trailers, "grpc-message")),
    answer.body.toString("utf8"),
    answer.body.toString("latin1"),
  ].join("\n");
  const sentText = [sent.path, safeDecode(sent.path), flatten(sent.headers), sent.body.toString()]
    .join("\n")
    .toLowerCase();
  const lower = text.toLowerCase();
  const problems: string[] = [];
  for (const f of forbidden) {
    const hit = f.exact ? text.includes(f.text) : lower.includes(f.text.toLowerCase());
    if (hit && !sentText.includes(f.text.toLowerCase())) problems.push(`leaks ${f.text.trim()}`);
  }
  for (const p of live.private) {
    if (lower.includes(p.toLowerCase())) problems.push(`leaks a private fragment (${p})`);
  }
  for (const s of live.secrets) if (text.includes(s)) problems.push("leaks a token secret");
  for (const m of text.match(secretPattern) ?? []) {
    if (live.secrets.has(m) || sentText.includes(m.toLowerCase())) continue;
    if (mayHoldNewSecret) live.secrets.add(m);
    else problems.push(`shows something shaped like a token secret (${m.slice(0, 6)}…)`);
  }
  return problems;
}

/** The routes of src/http (method + path shape), whose errors must be {"error","message"}. */
/** The REST routes of docs/rest.md (a method and a path without its query). */
function isRestRoute(method: string, p: string): boolean {
  const id = "[^/]+";
  const routes: [string, string][] = [
    ["POST", "/workers/register"],
    ["POST", "/tasks/claim"],
    ["POST", `/tasks/${id}/(heartbeat|result|failure)`],
    ["GET", "/api/mesh/(fleet/nodes|elastic/status|tasks|knowledge/export)"],
    ["POST", "/api/mesh/(fleet/nodes|tasks|knowledge/import)"],
    ["GET", `/api/mesh/fleet/nodes/${id}`],
    ["DELETE", `/api/mesh/fleet/nodes/${id}`],
    ["POST", `/api/mesh/fleet/nodes/${id}/(heartbeat|drain)`],
    ["GET", `/api/mesh/tasks/${id}(/result)?`],
    ["HEAD", `/api/mesh/tasks/${id}/result`],
    ["POST", `/api/mesh/tasks/${id}/(schedule|retry|lease/extend|migrate-for-checkpoint)`],
    ["PATCH", `/api/mesh/tasks/${id}/status`],
  ];
  return routes.some(([m, path]) => m === method && new RegExp(`^${path}$`).test(p));
}

function isPlainRoute(method: string, path: string): boolean {
  const p = path.split("?", 1)[0] ?? "";
  if (method === "PUT" && /^\/tasks\/[^/]+\/artifacts\/[^/]*$/.test(p)) return true;
  if (isRestRoute(method, p)) return true;
  if (!["GET", "HEAD"].includes(method)) return false;
  return (
    (method === "GET" && /^\/(healthz|readyz)$/.test(p)) ||
    // The web dashboard's page and assets (src/http/dashboard.ts).
    /^\/(index\.html)?$/.test(p) ||
    /^\/assets\/[^/]*$/.test(p) ||
    /^\/artifacts\/[^/]+\/download$/.test(p) ||
    /^\/tasks\/[^/]+\/(input|result)$/.test(p) ||
    // A dependency output by its name (`<ref or task id>/<filename>`, or one encoded segment).
    /^\/tasks\/[^/]+\/input\/[^/]+(\/[^/]+)?$/.test(p)
  );
}

function check(answer: Answer, sent: Sent): string[] {
  const problems: string[] = [];
  const name = sent.target?.name ?? "";
  const waits = mayWait.has(name);
  if (answer.cut) {
    // Only a long poll or a stream may still be open; the rest must have answered.
    if (!waits) return [`no answer within ${guardMs} ms`];
    if (answer.status !== 0 && answer.status !== 200) problems.push(`status ${answer.status}`);
    return [...problems, ...leakProblems(answer, sent, false)];
  }
  if (answer.status === 0) return [`no answer: ${answer.error ?? "connection closed"}`];
  if (answer.error) problems.push(`incomplete answer: ${answer.error}`);
  // 505: Connect refuses a bidi stream over HTTP/1.1 (it needs HTTP/2); the protocol's answer.
  const bidiOverH1 = !sent.h2 && sent.target?.method.methodKind === "bidi_streaming";
  // 405: Connect's answer to another method than POST (GET only for side-effect-free RPCs),
  // and a plain route's to a method it does not take (with Allow).
  const wrongMethod =
    (sent.method !== "POST" || sent.protocol === "plain") && !isPlainRoute(sent.method, sent.path);
  if (
    !allowedStatuses.has(answer.status) &&
    !(bidiOverH1 && answer.status === 505) &&
    !(wrongMethod && answer.status === 405)
  )
    problems.push(`status ${answer.status}`);
  const ok = answer.status >= 200 && answer.status < 300;
  problems.push(
    ...leakProblems(answer, sent, ok && name === "meshwork.v1.TokenService/CreateToken"),
  );

  const ct = headerValue(answer.headers, "content-type").toLowerCase();
  const bodyText = answer.body.toString("utf8");
  if (ct.startsWith("application/grpc-web")) {
    // Trailers-only in the headers, or a trailer frame (flag 0x80) at the end of the body.
    const frames = envelopes(answer.body);
    if (frames === "malformed") problems.push("gRPC-Web: malformed frames");
    let status = headerValue(answer.headers, "grpc-status") || undefined;
    if (frames !== "malformed") {
      const trailer = frames.find((f) => (f.flags & 0x80) !== 0);
      const m = trailer && /^grpc-status:\s*(\S*)\s*$/im.exec(trailer.data.toString("latin1"));
      if (m) status = m[1];
    }
    if (answer.status === 200) problems.push(...grpcStatusProblems(status, "gRPC-Web"));
  } else if (ct.startsWith("application/grpc")) {
    const status =
      headerValue(answer.trailers, "grpc-status") ||
      headerValue(answer.headers, "grpc-status") ||
      undefined;
    problems.push(...grpcStatusProblems(status, "gRPC"));
  } else if (ct.startsWith("application/connect+")) {
    const frames = envelopes(answer.body);
    if (frames === "malformed") problems.push("Connect stream: malformed envelopes");
    else {
      const end = frames.at(-1);
      if (!end || (end.flags & 0x02) === 0) {
        if (!waits) problems.push("Connect stream: no end-stream message");
      } else {
        const json = parseJson(end.data.toString("utf8"));
        if (!isRecord(json)) problems.push("Connect stream: end-stream is not a JSON object");
        else if (json.error !== undefined)
          problems.push(...connectErrorProblems(json.error, "Connect end-stream error"));
      }
    }
  } else if (ct.startsWith("application/json")) {
    const json = parseJson(bodyText);
    if (sent.method === "HEAD") {
      // No body to a HEAD.
    } else if (json === undefined) problems.push("JSON answer that is not JSON");
    else if (answer.status >= 400) {
      // Plain routes answer {error, message}, and so do an unknown path (404)
      // and a route's path asked with another method (405, with Allow).
      const plainShaped = isRecord(json) && "error" in json && !("code" in json);
      if (sent.protocol === "plain" && (isPlainRoute(sent.method, sent.path) || plainShaped)) {
        if (!isRecord(json)) problems.push("plain error: not a JSON object");
        else {
          if (typeof json.error !== "string" || !connectCodes.has(json.error))
            problems.push(`plain error: error ${JSON.stringify(json.error)}`);
          else if (unexpectedCodes.has(json.error))
            problems.push(`plain error: ${json.error} (unexpected)`);
          if (typeof json.message !== "string") problems.push("plain error: message");
        }
      } else problems.push(...connectErrorProblems(json, "Connect error"));
    }
  } else if (answer.status >= 400) {
    // No JSON: only the protocol-level refusals answer without a body of their own,
    // and Node's HTTP parser, which refuses what it cannot parse (an unknown method)
    // with an empty 400 and closes the connection.
    const parserRefusal =
      answer.status === 400 &&
      answer.body.length === 0 &&
      headerValue(answer.headers, "connection") === "close";
    if (parserRefusal) {
      // Node's own answer, before any Meshwork code runs.
    } else if (answer.status === 416) {
      // An unsatisfiable Range: Content-Range and no body (docs/protocol.md, byte routes).
      if (!/^bytes \*\/\d+$/.test(headerValue(answer.headers, "content-range")))
        problems.push("416 without Content-Range: bytes */<size>");
    } else if (sent.protocol === "plain" && isPlainRoute(sent.method, sent.path))
      problems.push(`plain route error ${answer.status} without a JSON body`);
    else if (
      ![404, 408, 413, 415, 431].includes(answer.status) &&
      !(bidiOverH1 && answer.status === 505) &&
      !(wrongMethod && answer.status === 405)
    )
      problems.push(`error ${answer.status} with content-type ${JSON.stringify(ct)}`);
  }
  return problems;
}

/** What the runs reached, per protocol: printed at the end (how deep the inputs got). */
const tally = new Map<
  string,
  { requests: number; reachedRpc: number; handlerOk: number; outcomes: Map<string, number> }
>();

/** A short name for an answer: its status, and its Connect or gRPC code when it has one. */
function outcomeOf(answer: Answer): string {
  if (answer.cut) return "cut by the guard";
  const grpc =
    headerValue(answer.trailers, "grpc-status") || headerValue(answer.headers, "grpc-status");
  if (grpc) return `grpc-status ${grpc}`;
  const json = parseJson(answer.body.toString("utf8"));
  if (isRecord(json) && typeof json.code === "string") return `${answer.status} ${json.code}`;
  if (isRecord(json) && typeof json.error === "string") return `${answer.status} ${json.error}`;
  const frames = envelopes(answer.body);
  const end = frames === "malformed" ? undefined : frames.at(-1);
  const web = end && (end.flags & 0x80) !== 0 && /grpc-status:\s*(\d+)/i.exec(end.data.toString());
  if (web) return `gRPC-Web grpc-status ${web[1]}`;
  if (end && (end.flags & 0x02) !== 0) {
    const e = parseJson(end.data.toString("utf8"));
    const code = isRecord(e) && isRecord(e.error) ? e.error.code : "ok";
    return `${answer.status} end-stream ${String(code)}`;
  }
  return String(answer.status);
}

function record(sent: Sent, answer: Answer, log: string[]): void {
  const key = sent.protocol + (sent.h2 && sent.protocol !== "grpc" ? " (h2)" : "");
  const t = tally.get(key) ?? { requests: 0, reachedRpc: 0, handlerOk: 0, outcomes: new Map() };
  tally.set(key, t);
  t.requests++;
  if (log.some((l) => /"msg":"rpc( refused| failed)?"/.test(l))) t.reachedRpc++;
  if (log.some((l) => /"code":"ok"/.test(l))) t.handlerOk++;
  const o = outcomeOf(answer);
  t.outcomes.set(o, (t.outcomes.get(o) ?? 0) + 1);
}

async function exchange(sent: Sent): Promise<void> {
  const logged = logLines.length;
  const answer = await send(sent);
  record(sent, answer, logLines.slice(logged));
  const problems = check(answer, sent);
  if (problems.length > 0) {
    // What the server logged at level error meanwhile (an unexpected error's cause).
    const errors = logLines.slice(logged).filter((l) => /"level":"(error|fatal)"/.test(l));
    throw new Error(
      [
        `${sent.protocol} ${sent.method} ${sent.path}: ${problems.join("; ")}`,
        `answer: ${answer.status} ${flatten(answer.headers).replaceAll("\n", " | ")}`,
        `trailers: ${flatten(answer.trailers).replaceAll("\n", " | ")}`,
        `body: ${answer.body.toString("utf8").slice(0, 600)}`,
        ...errors.map((l) => `server log: ${l.slice(0, 1500)}`),
      ].join("\n"),
    );
  }
}

// ---------------------------------------------------------------------------
// Generators

/** Strings the generators draw from: none contains a forbidden fragment (see above). */
const nastyStrings = [
  "",
  " ",
  "\t",
  "../",
  "../../../../etc/passwd",
  "..\\..\\windows\\win.ini",
  "%2e%2e%2f%2e%2e%2f",
  "%2e%2e",
  "..%00",
  "\u0000",
  "a\u0000b",
  "%00",
  "'; drop table tasks; --",
  "' or '1'='1",
  '"; delete from tokens; --',
  "1); truncate artifacts; --",
  "$1",
  "::uuid",
  "\\x00",
  "😀",
  "\ud800",
  "\udfff\ud800",
  "\u202eevil",
  "ß",
  "İ",
  "\ufeff",
  "\r\n",
  "<script>alert(1)</script>",
  "\u0024{7*7}",
  "{{7*7}}",
  "%s%s%n",
  "NaN",
  "Infinity",
  "-0",
  "1e309",
  "9223372036854775808",
  "-9223372036854775809",
  "0x10",
  "null",
  "true",
  "[]",
  "{}",
  "00000000-0000-0000-0000-000000000000",
  "00000000-0000-4000-8000-000000000000",
  "ffffffff-ffff-ffff-ffff-ffffffffffff",
  "00000000-0000-4000-8000-00000000000g",
  "file:///etc/passwd",
  "http://127.0.0.1:1/artifacts/x/download",
  "TOKEN_ROLE_ADMIN",
  "TASK_STATE_RUNNING",
  "__proto__",
  "constructor",
  "x".repeat(257),
  "x".repeat(4097),
  "../".repeat(700),
  "é".repeat(3000),
];

const realId = fc.constantFrom(0, 1, 2).map((i) => live.ids[i] ?? "");

const stringArb: fc.Arbitrary<string> = fc.oneof(
  { weight: 5, arbitrary: fc.constantFrom(...nastyStrings) },
  // Plain values pass the validators, so that the hostile ones elsewhere reach the stores.
  { weight: 3, arbitrary: fc.constantFrom("fuzz", "w", "render", "a.b-c_d", "k") },
  { weight: 3, arbitrary: fc.string({ maxLength: 40 }) },
  { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 40 }) },
  { weight: 2, arbitrary: fc.uuid() },
  { weight: 2, arbitrary: realId },
  { weight: 1, arbitrary: realId.map((s) => s.toUpperCase()) },
  {
    weight: 1,
    arbitrary: fc
      .tuple(fc.constantFrom(...nastyStrings), fc.string({ maxLength: 10 }))
      .map(([a, b]) => a + b),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(
        fc.constantFrom("a", "../", "%2e", "\u0000", "é", "😀"),
        fc.integer({ min: 50, max: 3000 }),
      )
      .map(([s, n]) => s.repeat(n)),
  },
);

const numberArb: fc.Arbitrary<number | string> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.constantFrom(
      0,
      -1,
      1,
      2,
      5,
      30,
      31,
      59,
      60,
      100,
      101,
      1000,
      1001,
      86_400,
      86_401,
      2 ** 31 - 1,
      2 ** 31,
      -(2 ** 31),
      2 ** 32,
      2 ** 53,
      -(2 ** 53),
      2 ** 53 + 2,
      1e21,
      1e308,
      -1e308,
      0.5,
      -0.0001,
      5e-324,
    ),
  },
  { weight: 2, arbitrary: fc.integer() },
  { weight: 1, arbitrary: fc.double() },
  {
    weight: 2,
    arbitrary: fc.constantFrom(
      "NaN",
      "Infinity",
      "-Infinity",
      "1e3",
      "0x1F",
      "",
      " 1",
      "9223372036854775807",
      "18446744073709551616",
      "-9223372036854775809",
      "1.5",
      "01",
    ),
  },
  { weight: 1, arbitrary: fc.bigInt().map(String) },
);

const anyJson: fc.Arbitrary<unknown> = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  stringArb,
  numberArb,
  fc.constant(null),
);

/**
 * Two kinds of message: "typed" ones decode (each field has a value of its
 * JSON type, in or just out of its range, strings hostile) and so reach the
 * interceptors and handlers; "hostile" ones mostly do not (any JSON in any
 * field, unknown keys) and exercise the decoders.
 */
type Mode = "typed" | "hostile";

const int32Range = { min: -(2 ** 31), max: 2 ** 31 - 1 };

function intArb(t: ScalarType): fc.Arbitrary<unknown> {
  switch (t) {
    case ScalarType.INT32:
    case ScalarType.SINT32:
    case ScalarType.SFIXED32:
      return fc.oneof(
        fc.constantFrom(0, -1, 1, 2, 5, 30, 31, 59, 60, 100, 101, 1000, 1001, 86_400, 86_401),
        fc.constantFrom(int32Range.min, int32Range.max),
        fc.integer(int32Range),
      );
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return fc.oneof(
        fc.constantFrom(0, 1, 2, 30, 31, 100, 101, 1000, 1001, 2 ** 31, 2 ** 32 - 1),
        fc.integer({ min: 0, max: 2 ** 32 - 1 }),
      );
    case ScalarType.UINT64:
    case ScalarType.FIXED64:
      return fc.oneof(
        fc.constantFrom("0", "1", "18446744073709551615", "9007199254740993"),
        fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }).map(String),
        fc.nat(),
      );
    default:
      return fc.oneof(
        fc.constantFrom("0", "-1", "9223372036854775807", "-9223372036854775808", 2 ** 53),
        fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }).map(String),
        fc.integer(),
      );
  }
}

function scalarArb(t: ScalarType, mode: Mode): fc.Arbitrary<unknown> {
  switch (t) {
    case ScalarType.STRING:
      return stringArb;
    case ScalarType.BOOL:
      return mode === "typed"
        ? fc.boolean()
        : fc.oneof(fc.boolean(), fc.constantFrom("true", 0, 1, null, "yes"));
    case ScalarType.BYTES:
      return fc.oneof(
        fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.from(b).toString("base64")),
        fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.from(b).toString("base64url")),
        mode === "typed" ? fc.constant("") : stringArb,
      );
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return mode === "typed"
        ? fc.oneof(
            fc.double({ noNaN: true, noDefaultInfinity: true }),
            fc.constantFrom("NaN", "Infinity", "-Infinity", 1e308, -0),
          )
        : numberArb;
    default:
      return mode === "typed" ? intArb(t) : numberArb;
  }
}

function enumArb(e: DescEnum, mode: Mode): fc.Arbitrary<unknown> {
  const names = fc.constantFrom(...e.values.map((v) => v.name));
  const numbers = fc.constantFrom(...e.values.map((v) => v.number));
  if (mode === "typed") return fc.oneof({ weight: 4, arbitrary: names }, numbers, fc.integer());
  return fc.oneof(
    { weight: 3, arbitrary: names },
    { weight: 2, arbitrary: numbers },
    { weight: 1, arbitrary: numberArb },
    { weight: 1, arbitrary: stringArb },
  );
}

const timestampArb = (mode: Mode) =>
  fc.oneof(
    fc.constantFrom(
      "1970-01-01T00:00:00Z",
      "0001-01-01T00:00:00Z",
      "9999-12-31T23:59:59.999999999Z",
      "2026-01-01T00:00:00+01:00",
      "2026-01-01T00:00:00.123456789Z",
    ),
    fc
      .date({ noInvalidDate: true, min: new Date("0001-01-01"), max: new Date("9999-12-31") })
      .map((d) => d.toISOString()),
    ...(mode === "typed"
      ? []
      : [
          fc.constantFrom("10000-01-01T00:00:00Z", "2026-02-30T00:00:00Z", "-1"),
          stringArb,
          numberArb,
        ]),
  );

const durationArb = (mode: Mode) =>
  fc.oneof(
    fc.constantFrom("0s", "1s", "-1s", "1.5s", "0.000000001s", "315576000000s", "-315576000000s"),
    fc.integer({ min: -315_576_000_000, max: 315_576_000_000 }).map((n) => `${n}s`),
    ...(mode === "typed"
      ? []
      : [fc.constantFrom("315576000001s", "1e9s", "s", "1m"), stringArb, numberArb]),
  );

/** Sets a property even when it is "__proto__" (a hostile key, sent as such). */
function put(o: Record<string, unknown>, k: string, v: unknown): void {
  Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
}

const keyArb = fc.oneof(
  { weight: 3, arbitrary: fc.string({ maxLength: 12 }) },
  {
    weight: 1,
    arbitrary: fc.constantFrom("__proto__", "constructor", "", "x".repeat(300), "a\u0000"),
  },
  { weight: 1, arbitrary: stringArb },
);

/** How many copies of `v` fit in about 3 MB of JSON (at most `n`): bodies stay bounded. */
function copies(v: unknown, n: number): number {
  const size = JSON.stringify(v)?.length ?? 4;
  return Math.max(1, Math.min(n, Math.floor(3_000_000 / size)));
}

/**
 * Big lists and maps (99–1002 entries, around the servers' limits) only at
 * the top of a message, so that a body stays within a few MB.
 */
function dictionaryOf(
  value: fc.Arbitrary<unknown>,
  key = keyArb,
  big = true,
): fc.Arbitrary<unknown> {
  const small = fc.array(fc.tuple(key, value), { maxLength: 5 }).map((kvs) => {
    const o: Record<string, unknown> = {};
    for (const [k, v] of kvs) put(o, k, v);
    return o;
  });
  if (!big) return small;
  return fc.oneof(
    { weight: 4, arbitrary: small },
    {
      weight: 1,
      arbitrary: fc.tuple(value, fc.integer({ min: 99, max: 1002 })).map(([v, n]) => {
        const o: Record<string, unknown> = {};
        for (let i = 0; i < copies(v, n); i++) put(o, `k${i}`, v);
        return o;
      }),
    },
  );
}

function listOf(element: fc.Arbitrary<unknown>, big = true): fc.Arbitrary<unknown> {
  if (!big) return fc.array(element, { maxLength: 5 });
  return fc.oneof(
    { weight: 4, arbitrary: fc.array(element, { maxLength: 5 }) },
    {
      weight: 1,
      arbitrary: fc
        .tuple(element, fc.integer({ min: 99, max: 1002 }))
        .map(([v, n]) => Array.from({ length: copies(v, n) }, () => v)),
    },
  );
}

const messageArbs = new Map<string, fc.Arbitrary<Record<string, unknown>>>();

function messageValueArb(m: DescMessage, depth: number, mode: Mode): fc.Arbitrary<unknown> {
  switch (m.typeName) {
    case "google.protobuf.Timestamp":
      return timestampArb(mode);
    case "google.protobuf.Duration":
      return durationArb(mode);
    case "google.protobuf.Struct":
      return mode === "typed"
        ? dictionaryOf(fc.jsonValue({ maxDepth: 3 }), keyArb, depth === 0)
        : fc.oneof(dictionaryOf(anyJson, keyArb, depth === 0), anyJson);
  }
  if (m.typeName.startsWith("google.protobuf.")) return fc.jsonValue({ maxDepth: 2 });
  if (depth >= 3) return mode === "typed" ? fc.constant({}) : anyJson;
  const nested = messageArb(m, depth + 1, mode);
  return mode === "typed" ? nested : fc.oneof({ weight: 4, arbitrary: nested }, anyJson);
}

function elementArb(
  kind: "scalar" | "enum" | "message",
  f: { scalar?: ScalarType; enum?: DescEnum; message?: DescMessage },
  depth: number,
  mode: Mode,
): fc.Arbitrary<unknown> {
  if (kind === "enum" && f.enum) return enumArb(f.enum, mode);
  if (kind === "message" && f.message) return messageValueArb(f.message, depth, mode);
  return scalarArb(f.scalar ?? ScalarType.STRING, mode);
}

/** Ids (`task_id`, `worker_id`…): real ones, random UUIDs, or anything. */
const idArb = fc.oneof(
  { weight: 3, arbitrary: realId },
  { weight: 2, arbitrary: fc.uuid() },
  { weight: 1, arbitrary: stringArb },
);

/**
 * Page tokens shaped like the server's (base64url JSON of a time in ms and
 * keys), with extreme times and odd keys, or anything.
 */
const pageTokenArb = fc.oneof(
  { weight: 1, arbitrary: stringArb },
  {
    weight: 2,
    arbitrary: fc
      .tuple(
        fc.oneof(
          fc.constantFrom(0, -1, 8.64e15, -8.64e15, 8.64e15 + 1, 253_402_300_800_000, 1e300, -0.5),
          fc.integer(),
          fc.double(),
        ),
        fc.array(fc.oneof(idArb, stringArb), { maxLength: 3 }),
      )
      .map(([ms, keys]) => Buffer.from(JSON.stringify([ms, ...keys])).toString("base64url")),
  },
);

function fieldArb(f: DescField, depth: number, mode: Mode): fc.Arbitrary<unknown> {
  let typed: fc.Arbitrary<unknown>;
  switch (f.fieldKind) {
    case "scalar":
      typed =
        f.scalar !== ScalarType.STRING
          ? scalarArb(f.scalar, mode)
          : f.name === "page_token"
            ? pageTokenArb
            : /(^|_)id$/.test(f.name)
              ? idArb
              : scalarArb(f.scalar, mode);
      break;
    case "enum":
      typed = enumArb(f.enum, mode);
      break;
    case "message":
      typed = messageValueArb(f.message, depth, mode);
      break;
    case "list":
      typed = listOf(elementArb(f.listKind, f, depth, mode), depth === 0);
      break;
    case "map":
      typed = dictionaryOf(
        elementArb(f.mapKind, f, depth, mode),
        f.mapKey === ScalarType.STRING ? keyArb : intArb(f.mapKey).map(String),
        depth === 0,
      );
      break;
  }
  if (mode === "typed") return typed;
  return fc.oneof({ weight: 6, arbitrary: typed }, { weight: 1, arbitrary: anyJson });
}

/** A field under its proto name or its JSON name, as Connect accepts both. */
function entryArb(f: DescField, depth: number, mode: Mode) {
  return fc.tuple(fc.constantFrom(f.name, f.jsonName), fieldArb(f, depth, mode));
}

/** An object with the message's real field names (snake_case or camelCase) and random values. */
function messageArb(
  m: DescMessage,
  depth = 0,
  mode: Mode = "hostile",
): fc.Arbitrary<Record<string, unknown>> {
  const key = `${m.typeName}@${depth}@${mode}`;
  const known = messageArbs.get(key);
  if (known) return known;
  // Typed: at most one member of each oneof; hostile: any of them, and unknown keys.
  const members = m.members.map((member) =>
    member.kind === "oneof" && mode === "typed"
      ? fc
          .option(
            fc.constantFrom(...member.fields).chain((f) => entryArb(f, depth, mode)),
            { freq: 2, nil: undefined },
          )
          .map((e) => (e === undefined ? [] : [e]))
      : fc.array(
          fc
            .constantFrom(...(member.kind === "oneof" ? member.fields : [member]))
            .chain((f) => entryArb(f, depth, mode)),
          { maxLength: member.kind === "oneof" ? 2 : 1 },
        ),
  );
  const extra =
    mode === "typed"
      ? fc.constant([] as [string, unknown][])
      : fc.oneof(
          { weight: 6, arbitrary: fc.constant([] as [string, unknown][]) },
          { weight: 1, arbitrary: fc.array(fc.tuple(keyArb, anyJson), { maxLength: 2 }) },
        );
  const arb = fc.tuple(fc.tuple(...members), extra).map(([present, unknown]) => {
    const o: Record<string, unknown> = {};
    for (const [k, v] of present.flat()) put(o, k, v);
    for (const [k, v] of unknown) put(o, k, v);
    return o;
  });
  messageArbs.set(key, arb);
  return arb;
}

/** A Connect JSON body for one message: mostly a message-shaped object, sometimes anything. */
function jsonTextArb(m: DescMessage): fc.Arbitrary<string> {
  return fc.oneof(
    { weight: 6, arbitrary: messageArb(m, 0, "typed").map((o) => JSON.stringify(o)) },
    { weight: 4, arbitrary: messageArb(m, 0, "hostile").map((o) => JSON.stringify(o)) },
    { weight: 2, arbitrary: fc.jsonValue().map((v) => JSON.stringify(v)) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        "",
        "{",
        "}",
        "[",
        "null",
        '{"a":',
        "\u0000",
        "{}{}",
        '{"__proto__":{"polluted":1}}',
        '"str"',
        "1e999",
        '{"workerId":1e999}',
        '{"task_id":"a","taskId":"b"}',
        "\ufeff{}",
      ),
    },
    { weight: 1, arbitrary: fc.string({ maxLength: 80 }) },
  );
}

/** Binary protobuf for one message: random bytes, a real encoding, or a damaged one. */
function protoArb(m: DescMessage): fc.Arbitrary<Buffer> {
  const encoded = fc.oneof(messageArb(m, 0, "typed"), messageArb(m, 0, "hostile")).map((o) => {
    try {
      return Buffer.from(toBinary(m, fromJson(m, o as JsonValue, { ignoreUnknownFields: true })));
    } catch {
      return Buffer.from(JSON.stringify(o));
    }
  });
  return fc.oneof(
    { weight: 3, arbitrary: fc.uint8Array({ maxLength: 512 }).map((b) => Buffer.from(b)) },
    { weight: 4, arbitrary: encoded },
    {
      weight: 2,
      arbitrary: fc
        .tuple(encoded, fc.nat(), fc.integer({ min: 0, max: 255 }), fc.boolean())
        .map(([b, at, byte, cut]) => {
          if (b.length === 0) return Buffer.from([byte]);
          const copy = Buffer.from(b);
          copy[at % copy.length] = byte;
          return cut ? copy.subarray(0, at % copy.length) : copy;
        }),
    },
  );
}

function frame(flags: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt8(flags, 0);
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

const printable = fc.string({
  unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)),
  maxLength: 60,
});

type Role = "admin" | "client" | "worker" | "revoked";

/** An Authorization header (or none): valid tokens most often, so that handlers run. */
const authArb: fc.Arbitrary<string | undefined> = fc.oneof(
  {
    weight: 8,
    arbitrary: fc
      .constantFrom<Role>("admin", "admin", "client", "worker")
      .map((r) => `Bearer ${live.tokens[r]}`),
  },
  { weight: 1, arbitrary: fc.constant<Role>("revoked").map((r) => `Bearer ${live.tokens[r]}`) },
  { weight: 1, arbitrary: fc.constant(undefined) },
  {
    weight: 2,
    arbitrary: fc.constantFrom(
      "",
      "Bearer",
      "Bearer ",
      "bearer",
      "Basic YWRtaW46YWRtaW4=",
      "Basic",
      "Token abc",
      `Bearer mw_${"A".repeat(43)}`,
      `Bearer ${"x".repeat(600)}`,
      "Bearer a b",
      "Bearer\tabc",
      "Bearer ../../etc/passwd",
      "Negotiate YIIB",
      "Bearer =",
    ),
  },
  { weight: 1, arbitrary: printable.map((s) => `Bearer ${s}`) },
  { weight: 1, arbitrary: printable },
  {
    weight: 1,
    arbitrary: fc
      .tuple(fc.constantFrom<Role>("admin", "client", "worker"), fc.nat(5))
      .map(([r, how]) => {
        const t = live.tokens[r];
        return [
          `bearer ${t}`,
          `Bearer  ${t}  `,
          `Bearer ${t}x`,
          `Bearer ${t.slice(0, -1)}`,
          `Bearer ${t.toUpperCase()}`,
          `Basic ${Buffer.from(`x:${t}`).toString("base64")}`,
        ][how] as string;
      }),
  },
);

/** A header that is absent `absent` times out of `absent + 1`. */
const maybe = <T>(arb: fc.Arbitrary<T>, absent = 6) =>
  fc.oneof(
    { weight: absent, arbitrary: fc.constant(undefined) },
    { weight: 1, arbitrary: arb as fc.Arbitrary<T | undefined> },
  );

const connectHeadersArb = fc.record({
  authorization: authArb,
  "connect-protocol-version": maybe(fc.oneof(fc.constantFrom("1", "2", "0", "", "1.0"), printable)),
  "connect-timeout-ms": maybe(
    fc.oneof(
      fc.constantFrom("0", "1", "-1", "abc", "99999999999", "1.5", "10000000000", " 5", "5000"),
      printable,
    ),
  ),
  "content-encoding": maybe(
    fc.constantFrom("gzip", "br", "identity", "deflate", "zstd", "gzip, gzip", "GZIP", "x"),
  ),
  "connect-content-encoding": maybe(fc.constantFrom("gzip", "br", "identity", "x")),
  "x-correlation-id": maybe(fc.oneof(printable, fc.uuid())),
  contentType: maybe(
    fc.oneof(
      fc.constantFrom(
        "application/json",
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        "application/json; charset=latin1",
        "application/JSON",
        "application/proto",
        "application/connect+json",
        "application/connect+proto",
        "application/grpc",
        "application/grpc-web+json",
        "text/plain",
        "multipart/form-data; boundary=x",
        "",
        "application/json, text/plain",
      ),
      printable,
    ),
    5,
  ),
  /** gzip the body when a gzip encoding is named, so that some compressed requests are valid. */
  compress: fc.boolean(),
});

type ConnectHeaders = typeof connectHeadersArb extends fc.Arbitrary<infer H> ? H : never;

/** The HTTP headers of a Connect or gRPC-Web request, and the body as it goes on the wire. */
function connectRequest(
  h: ConnectHeaders,
  contentType: string,
  body: Buffer,
): { headers: Record<string, string>; body: Buffer } {
  const headers: Record<string, string> = { "content-type": h.contentType ?? contentType };
  for (const k of [
    "authorization",
    "connect-protocol-version",
    "connect-timeout-ms",
    "content-encoding",
    "connect-content-encoding",
    "x-correlation-id",
  ] as const) {
    const v = h[k];
    if (v !== undefined) headers[k] = v;
  }
  const gzip = (h["content-encoding"] ?? "").toLowerCase() === "gzip";
  return { headers, body: gzip && h.compress ? gzipSync(body) : body };
}

// ---------------------------------------------------------------------------
// Cases per property

const connectJsonCase = (t: Target) =>
  fc.record({
    target: fc.constant(t),
    messages: fc.oneof(
      { weight: 6, arbitrary: jsonTextArb(t.method.input).map((m) => [m]) },
      {
        weight: 1,
        arbitrary: fc.array(jsonTextArb(t.method.input), { minLength: 1, maxLength: 3 }),
      },
    ),
    /** Streaming RPCs want enveloped application/connect+json, unary ones plain JSON: sometimes swapped. */
    wrongFraming: fc.nat(9).map((n) => n === 0),
    trailing: fc.option(fc.uint8Array({ maxLength: 8 }), { freq: 8, nil: undefined }),
    h2: fc.boolean(),
    headers: connectHeadersArb,
  });

const binaryCase = (t: Target) =>
  fc.record({
    target: fc.constant(t),
    messages: fc.oneof(
      { weight: 6, arbitrary: protoArb(t.method.input).map((m) => [m]) },
      { weight: 1, arbitrary: fc.array(protoArb(t.method.input), { minLength: 1, maxLength: 3 }) },
    ),
    /** Connect (unary or streaming) or gRPC-Web, over HTTP/1.1. */
    grpcWeb: fc.boolean(),
    wrongFraming: fc.nat(9).map((n) => n === 0),
    h2: fc.boolean(),
    headers: connectHeadersArb,
  });

const grpcCase = (t: Target) =>
  fc.record({
    target: fc.constant(t),
    json: fc.nat(7).map((n) => n === 0),
    // One message mostly; none or several now and then (a unary RPC wants exactly one).
    messages: fc.oneof(
      { weight: 6, arbitrary: protoArb(t.method.input).map((m) => [m]) },
      { weight: 1, arbitrary: fc.array(protoArb(t.method.input), { maxLength: 3 }) },
    ),
    jsonMessages: fc.array(jsonTextArb(t.method.input), { minLength: 1, maxLength: 2 }),
    compress: fc.nat(5).map((n) => n === 0),
    headers: fc.record({
      authorization: authArb,
      "content-type": fc.oneof(
        { weight: 8, arbitrary: fc.constant("application/grpc") },
        {
          weight: 2,
          arbitrary: fc.constantFrom(
            "application/grpc+proto",
            "application/grpc+json",
            "application/grpc; charset=utf-8",
            "application/grpc-web",
            "application/json",
            "application/proto",
            "text/plain",
            "application/grpc+xml",
          ),
        },
      ),
      // Node's HTTP/2 client sends no other `te` (RFC 9113 allows only "trailers").
      te: fc.oneof(
        { weight: 8, arbitrary: fc.constant("trailers") },
        { weight: 1, arbitrary: fc.constant(undefined) },
      ),
      "grpc-timeout": maybe(
        fc.oneof(
          fc.constantFrom(
            "1S",
            "0n",
            "1n",
            "99999999H",
            "100000000H",
            "abc",
            "1m",
            "-1S",
            "10u",
            "1",
            "S",
            "123456789S",
          ),
          printable,
        ),
      ),
      "grpc-encoding": maybe(fc.constantFrom("gzip", "identity", "deflate", "snappy", "x", "GZIP")),
      "grpc-accept-encoding": maybe(fc.constantFrom("gzip", "identity", "x")),
      "x-correlation-id": maybe(printable),
    }),
  });

const uuidSegment = fc.oneof(
  realId,
  fc.uuid(),
  realId.map((s) => s.toUpperCase()),
);

const segmentArb = fc.oneof(
  { weight: 4, arbitrary: uuidSegment },
  {
    weight: 3,
    arbitrary: fc.constantFrom(
      "..",
      ".",
      "%2e%2e",
      "%2E%2E%2F",
      "%00",
      "%",
      "%zz",
      "%2F",
      "a%2Fb",
      "..%2f..%2fetc%2fpasswd",
      "x".repeat(300),
      "%F0%9F%98%80",
      "%C0%AE%C0%AE",
      "~",
      "'or'1'='1",
    ),
  },
  { weight: 2, arbitrary: stringArb.map((s) => percentEncode(s.slice(0, 400))) },
  { weight: 2, arbitrary: fc.stringMatching(/^[A-Za-z0-9._~-]{0,20}$/) },
);

/**
 * A string's UTF-8 bytes percent-encoded, except unreserved characters and
 * "%" itself (so that "%2e%2e" and a stray "%" reach the server as they are).
 */
function percentEncode(s: string): string {
  return [...Buffer.from(s, "utf8")]
    .map((b) =>
      /[A-Za-z0-9._~%-]/.test(String.fromCharCode(b))
        ? String.fromCharCode(b)
        : `%${b.toString(16).toUpperCase().padStart(2, "0")}`,
    )
    .join("");
}

/** Strings safe as a raw request path (Node refuses spaces and control characters). */
function pathSafe(s: string): string {
  return s.replace(/[^\u0021-\u007e]/g, (c) => percentEncode(c));
}

const filenameArb = fc.oneof(
  fc.constantFrom(
    "out.txt",
    ".hidden",
    "a..b",
    "%2e%2e%2fpasswd",
    "..",
    "x".repeat(256),
    "",
    "a%00b",
    "%zz",
    "con",
  ),
  segmentArb,
);

/** A JSON object with the REST routes' field names and random values. */
const restBodyArb = fc
  .dictionary(
    fc.constantFrom(
      ...["worker_id", "attempt", "capabilities", "max_concurrency", "result", "metrics"],
      ...["error_code", "error_message", "name", "cpu_count", "memory_mb", "lease_token"],
      ...["peerId", "status", "leaseToken", "resultHandle", "idempotencyKey", "drained"],
      ...["requiredBrickIds", "adaptations", "patterns", "queueDepth", "extendSeconds"],
      ...["checkpointHandle", "scheduleIdempotencyKey", "leaseSeconds", "deadlineUtc"],
    ),
    fc.jsonValue({ maxDepth: 2 }),
    { maxKeys: 6 },
  )
  .map((o) => new TextEncoder().encode(JSON.stringify(o)));

const anyMethodArb = fc.oneof(
  { weight: 8, arbitrary: fc.constantFrom("GET", "HEAD", "PUT") },
  { weight: 2, arbitrary: fc.constantFrom("POST", "DELETE", "OPTIONS", "PATCH", "TRACE") },
  { weight: 1, arbitrary: fc.stringMatching(/^[A-Z]{1,10}$/).filter((m) => m !== "CONNECT") },
);

/** A path, and the methods its route takes (so that most requests reach a route). */
const routeArb: fc.Arbitrary<[string, string[]]> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc
      .tuple(segmentArb, filenameArb)
      .map(([id, name]): [string, string[]] => [`/tasks/${id}/artifacts/${name}`, ["PUT"]]),
  },
  {
    weight: 3,
    arbitrary: segmentArb.map((id): [string, string[]] => [
      `/artifacts/${id}/download`,
      ["GET", "HEAD"],
    ]),
  },
  {
    weight: 3,
    arbitrary: fc
      .tuple(segmentArb, fc.constantFrom("input", "result"))
      .map(([id, which]): [string, string[]] => [`/tasks/${id}/${which}`, ["GET", "HEAD"]]),
  },
  {
    weight: 3,
    arbitrary: fc.oneof(
      fc.constantFrom<[string, string[]]>(
        ["/workers/register", ["POST"]],
        ["/tasks/claim", ["POST"]],
        ["/api/mesh/fleet/nodes", ["GET", "POST"]],
        ["/api/mesh/elastic/status", ["GET"]],
        ["/api/mesh/tasks", ["GET", "POST"]],
        ["/api/mesh/knowledge/export", ["GET"]],
        ["/api/mesh/knowledge/import", ["POST"]],
      ),
      fc
        .tuple(segmentArb, fc.constantFrom("heartbeat", "result", "failure"))
        .map(([id, op]): [string, string[]] => [`/tasks/${id}/${op}`, ["POST"]]),
      fc
        .tuple(segmentArb, fc.constantFrom("", "/heartbeat", "/drain"))
        .map(([id, op]): [string, string[]] => [
          `/api/mesh/fleet/nodes/${id}${op}`,
          op === "" ? ["DELETE"] : ["POST"],
        ]),
      fc
        .tuple(
          segmentArb,
          fc.constantFrom<[string, string[]]>(
            ["", ["GET"]],
            ["/result", ["GET", "HEAD"]],
            ["/schedule", ["POST"]],
            ["/retry", ["POST"]],
            ["/lease/extend", ["POST"]],
            ["/migrate-for-checkpoint", ["POST"]],
            ["/status", ["PATCH"]],
          ),
        )
        .map(([id, [op, methods]]): [string, string[]] => [`/api/mesh/tasks/${id}${op}`, methods]),
    ),
  },
  {
    weight: 2,
    arbitrary: fc
      .constantFrom(
        "/healthz",
        "/readyz",
        "/healthz/",
        "//healthz",
        "/HEALTHZ",
        "/readyz/../healthz",
        "/tasks//input",
        "/artifacts//download",
        "/tasks/x/artifacts/",
        "/tasks/x/artifacts/a/b",
        "http://127.0.0.1:1/healthz",
        "/grpc.health.v1.Health/Check",
        "/meshwork.v1.TaskService/",
        "/meshwork.v1.TaskService/Nope",
        "/meshwork.v1.NopeService/GetTask",
        "/",
        "/index.html",
        "/assets/",
        "/assets/nope.js",
        "/assets/..%2f..%2fpackage.json",
        "/%",
        "/..",
      )
      .map((p): [string, string[]] => [p, ["GET"]]),
  },
  {
    weight: 1,
    arbitrary: fc
      .array(segmentArb, { maxLength: 5 })
      .map((segs): [string, string[]] => [`/${segs.join("/")}`, ["GET"]]),
  },
);

/** A method (mostly one the route takes) and a raw path with, now and then, a query. */
const methodAndPathArb = fc
  .tuple(
    routeArb,
    fc.nat(4),
    anyMethodArb,
    maybe(
      fc.oneof(
        fc.constantFrom("?", "?x=1", "?a=%zz", "?connect=v1&encoding=json&message=%7B%7D", "#frag"),
        printable.map((s) => `?${encodeURIComponent(s)}`),
      ),
      3,
    ),
  )
  .map(([[path, methods], pick, other, query]) => ({
    method: pick === 0 ? other : (methods[pick % methods.length] ?? "GET"),
    path: pathSafe(path + (query ?? "")),
  }));

const plainCase = fc.record({
  target: methodAndPathArb,
  headers: fc.record({
    authorization: authArb,
    range: maybe(
      fc.oneof(
        fc.constantFrom(
          "bytes=0-0",
          "bytes=0-",
          "bytes=-1",
          "bytes=-0",
          "bytes=5-2",
          "bytes=0-99999999999999999999",
          "bytes=99999999999999999999-",
          "bytes=-99999999999999999999",
          "bytes=1-2,3-4",
          "bytes=",
          "bytes=-",
          "items=0-1",
          "bytes=0-1e3",
          "bytes=359-359",
          "bytes=360-",
        ),
        fc
          .tuple(fc.option(fc.nat(1000)), fc.option(fc.nat(1000)))
          .map(([a, b]) => `bytes=${a ?? ""}-${b ?? ""}`),
        printable,
      ),
    ),
    "if-none-match": maybe(fc.oneof(fc.constantFrom("*", '""', 'W/"x"'), printable)),
    "x-worker-id": maybe(fc.oneof(uuidSegment, printable), 2),
    "x-task-attempt": maybe(
      fc.constantFrom("1", "0", "-1", "abc", "1e400", "99999999999999999999", "1.5", "", " 1"),
      2,
    ),
    "x-lease-token": maybe(fc.oneof(printable, fc.constant("f".repeat(300)))),
    "x-content-sha256": maybe(
      fc.oneof(
        fc.constantFrom("A".repeat(64), "0".repeat(64), "g".repeat(64), "0".repeat(63)),
        printable,
      ),
    ),
    "x-artifact-kind": maybe(fc.constantFrom("CHECKPOINT", "checkpoint", "INPUT", "OUTPUT", "x")),
    "content-type": maybe(fc.oneof(fc.constantFrom("text/plain", "x".repeat(300)), printable)),
    "x-correlation-id": maybe(printable),
  }),
  body: fc.option(fc.oneof(fc.uint8Array({ maxLength: 2048 }), restBodyArb), {
    freq: 2,
    nil: undefined,
  }),
  chunked: fc.boolean(),
});

function defined(h: Record<string, string | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(h)) if (v !== undefined) out[k] = v;
  return out;
}

// ---------------------------------------------------------------------------
// Properties

/** One example per target first, so that every RPC is reached in every run; then random cases. */
function everyTarget<C>(caseOf: (t: Target) => fc.Arbitrary<C>): {
  arb: fc.Arbitrary<C>;
  examples: [C][];
} {
  const arb = fc.constantFrom(...targets).chain(caseOf);
  const examples = targets.map(
    (t, i) => fc.sample(caseOf(t), { numRuns: 1, seed: (seed ?? 42) + i })[0] as C,
  );
  return { arb, examples: examples.map((e) => [e]) };
}

/** fast-check's run parameters: FUZZ_SEED when set; a failure prints its seed and path. */
function params<T>(numRuns: number, examples: T[] = []): fc.Parameters<T> {
  return { numRuns, examples, ...(seed === undefined ? {} : { seed }) };
}

describe("fuzz: hostile input to a listening coordinator (auth on)", () => {
  beforeAll(setUp, 60_000);
  afterAll(async () => {
    const summary = [...tally].map(([protocol, t]) => {
      const top = [...t.outcomes].sort((x, y) => y[1] - x[1]).slice(0, 8);
      return `${protocol}: ${t.requests} requests, ${t.reachedRpc} reached the RPC interceptors, ${t.handlerOk} answered ok by a handler; ${top.map(([o, n]) => `${o} ×${n}`).join(", ")}`;
    });
    console.log(`fuzz summary (seed ${seed ?? "random"}):\n${summary.join("\n")}`);
    console.error = consoleError;
    session?.close();
    agent.destroy();
    await server?.close();
    await tdb?.drop();
  });

  it("enumerates every RPC of the eight services, as policy.ts lists them", () => {
    const listed = Object.keys(policy).filter((k) => k.startsWith("meshwork.v1."));
    expect(targets.map((t) => t.name).sort()).toEqual(listed.sort());
  });

  it(
    "Connect JSON: random JSON and message-shaped objects with extreme values, random headers",
    async () => {
      const { arb, examples } = everyTarget(connectJsonCase);
      await fc.assert(
        fc.asyncProperty(arb, async (c) => {
          const framed = c.target.streaming !== c.wrongFraming;
          const payload = framed
            ? Buffer.concat([
                ...c.messages.map((m) => frame(0, Buffer.from(m))),
                Buffer.from(c.trailing ?? []),
              ])
            : Buffer.from(c.messages[0] ?? "");
          const { headers, body } = connectRequest(
            c.headers,
            framed ? "application/connect+json" : "application/json",
            payload,
          );
          await exchange({
            protocol: "connect-json",
            h2: c.h2,
            target: c.target,
            method: "POST",
            path: `/${c.target.name}`,
            headers,
            body,
          });
        }),
        params(runs.json, examples),
      );
    },
    propertyTimeoutMs,
  );

  it(
    "Connect binary and gRPC-Web, over HTTP/1.1 and h2: random and damaged protobuf",
    async () => {
      const { arb, examples } = everyTarget(binaryCase);
      await fc.assert(
        fc.asyncProperty(arb, async (c) => {
          const framed = (c.target.streaming || c.grpcWeb) !== c.wrongFraming;
          const payload = framed
            ? Buffer.concat(c.messages.map((m) => frame(0, m)))
            : (c.messages[0] ?? Buffer.alloc(0));
          const contentType = c.grpcWeb
            ? "application/grpc-web+proto"
            : c.target.streaming
              ? "application/connect+proto"
              : "application/proto";
          const { headers, body } = connectRequest(c.headers, contentType, payload);
          if (c.grpcWeb) headers["x-grpc-web"] = "1";
          await exchange({
            protocol: "binary",
            h2: c.h2,
            target: c.target,
            method: "POST",
            path: `/${c.target.name}`,
            headers,
            body,
          });
        }),
        params(runs.binary, examples),
      );
    },
    propertyTimeoutMs,
  );

  it(
    "gRPC over HTTP/2 (one session): valid frame headers, random payloads and headers",
    async () => {
      const { arb, examples } = everyTarget(grpcCase);
      await fc.assert(
        fc.asyncProperty(arb, async (c) => {
          const gzip = c.headers["grpc-encoding"] === "gzip" && c.compress;
          const payloads = c.json ? c.jsonMessages.map((m) => Buffer.from(m)) : c.messages;
          const body = Buffer.concat(
            payloads.map((p) => (gzip ? frame(1, gzipSync(p)) : frame(0, p))),
          );
          await exchange({
            protocol: "grpc",
            h2: true,
            target: c.target,
            method: "POST",
            path: `/${c.target.name}`,
            headers: defined(c.headers),
            body,
          });
        }),
        params(runs.grpc, examples),
      );
    },
    propertyTimeoutMs,
  );

  it(
    "plain routes and random paths: random ids, file names, methods, ranges and headers",
    async () => {
      await fc.assert(
        fc.asyncProperty(plainCase, async (c) => {
          const { method, path } = c.target;
          await exchange({
            protocol: "plain",
            method,
            path,
            headers: defined(c.headers),
            body:
              c.body && !["GET", "HEAD"].includes(method) ? Buffer.from(c.body) : Buffer.alloc(0),
            chunked: c.chunked,
          });
        }),
        params(runs.plain),
      );
    },
    propertyTimeoutMs,
  );

  it("is still healthy afterwards, and its log holds no secret and no statement parameter", async () => {
    expect(sessionErrors).toEqual([]);
    expect(consoleErrors).toEqual([]);
    expect((await fetch(`${live.url}/healthz`)).status).toBe(200);
    expect((await fetch(`${live.url}/readyz`)).status).toBe(200);
    const status = (await rpc(live.tokens.admin, "FleetService/GetFleetStatus", {})) as Record<
      string,
      unknown
    >;
    expect(Array.isArray(status.taskCounts)).toBe(true);

    await new Promise((r) => setTimeout(r, 100)); // let the last log lines arrive
    const log = logLines.join("");
    expect(logLines.length).toBeGreaterThan(100);
    expect(log).toContain("rpc refused");
    for (const s of live.secrets) expect(log.includes(s), "a token secret in the log").toBe(false);
    expect(log.match(secretPattern) ?? []).toEqual([]);
    // Drizzle's failed statements carry their parameters in `params` and after "params:".
    expect(log).not.toMatch(/"params"\s*:/);
    expect(log).not.toMatch(/params: (?!\[not logged\])/);
    // No unexpected error happened anywhere, not even after an answer had begun.
    const errors = logLines.filter((l) => /"level":"(error|fatal)"/.test(l));
    expect(errors).toEqual([]);
  });
});
