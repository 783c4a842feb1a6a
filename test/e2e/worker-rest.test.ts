import { createHash, randomBytes, randomUUID } from "node:crypto";
import type { DescService, MessageInitShape } from "@bufbuild/protobuf";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import {
  type CreateTaskRequestSchema,
  type Task,
  TaskService,
  TaskState,
} from "../../gen/meshwork/v1/task_pb.js";
import { TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { uniqueWorkload } from "../support/harness.js";
import { useListeningServer } from "../support/server.js";

// The coordinator/worker REST contract (docs/rest.md, "Common rules" and
// "The coordinator/worker contract"; docs/protocol.md "Errors",
// "Authentication", "Byte routes", "Artifacts"), called the way a worker
// written against that contract calls it: plain fetch, snake_case JSON,
// exact statuses, no redirects followed. RPC clients only set things up
// (tokens, tasks, drain) and read what a route did (GetTask, GetWorker,
// ListArtifacts).

const server = useListeningServer({ auth: "on" });

type Json = Record<string, unknown>;

interface Answer {
  status: number;
  headers: Headers;
  text: string;
  body: Json | undefined;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const WHOLE_SECONDS_UTC = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/;
const HEX64 = /^[0-9a-f]{64}$/;
/** What an error message must never show: SQL, a stack frame, a file path, a token. */
const LEAKS = [
  /select /i,
  /insert /i,
  /delete from/i,
  /at .*\.[cm]?[jt]s:\d+/i,
  /\/work\//i,
  /\/home\//i,
  /node_modules/i,
  /\bsrc\/[\w/-]+\.[jt]s/i,
  /mw_[A-Za-z0-9_-]{20,}/,
];

const sha = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");
const bytes = (n: number, seed = 1) =>
  Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) & 0xff);
const obj = (v: unknown): Json => {
  expect(v, "a JSON object").toBeTypeOf("object");
  expect(v).not.toBeNull();
  return v as Json;
};

// ---------------------------------------------------------------- RPC setup

function as<S extends DescService>(service: S, token = server.adminToken): Client<S> {
  return createClient(
    service,
    createConnectTransport({
      baseUrl: server.url,
      httpVersion: "1.1",
      interceptors: [
        (next) => (req) => {
          req.header.set("authorization", `Bearer ${token}`);
          return next(req);
        },
      ],
    }),
  );
}

async function newToken(role: TokenRole): Promise<string> {
  const { secret } = await as(TokenService).createToken({
    name: `worker-rest-${randomBytes(4).toString("hex")}`,
    role,
  });
  return secret;
}

type CreateTaskInit = Omit<MessageInitShape<typeof CreateTaskRequestSchema>, "$typeName">;

async function createTask(workload: string, extra: Omit<CreateTaskInit, "workload"> = {}) {
  const { task } = await as(TaskService).createTask({ workload, ...extra });
  if (!task) throw new Error("CreateTask returned no task");
  return task;
}

async function getTask(taskId: string): Promise<Task> {
  const { task } = await as(TaskService).getTask({ taskId });
  if (!task) throw new Error("GetTask returned no task");
  return task;
}

/** What a refused request must leave as it was. */
function snapshot(t: Task) {
  return {
    state: t.state,
    attempt: t.attempt,
    leaseWorker: t.lease?.workerId ?? "",
    leaseExpiresAt: t.lease?.expiresAt ? timestampMs(t.lease.expiresAt) : 0,
    updatedAt: t.updatedAt ? timestampMs(t.updatedAt) : 0,
    result: t.result?.artifactId ?? "",
    error: t.error?.message ?? "",
  };
}

// ---------------------------------------------------------------- plain HTTP

/** One request as a worker makes it: no redirect followed, and none expected. */
async function call(
  method: string,
  path: string,
  token: string | undefined,
  init: { json?: unknown; raw?: string; headers?: Record<string, string> } = {},
): Promise<Answer> {
  const headers: Record<string, string> = { ...init.headers };
  if (token !== undefined) headers.authorization = `Bearer ${token}`;
  let body: string | undefined;
  if (init.raw !== undefined) body = init.raw;
  else if (init.json !== undefined) body = JSON.stringify(init.json);
  if (body !== undefined) headers["content-type"] ??= "application/json";
  const res = await fetch(`${server.url}${path}`, { method, headers, body, redirect: "manual" });
  return answer(res, `${method} ${path}`);
}

async function answer(res: Response, what: string): Promise<Answer> {
  const text = await res.text();
  expect(res.status >= 300 && res.status < 400, `${what} redirected (${res.status})`).toBe(false);
  expect(res.headers.get("location") === null || res.status === 201, `${what} Location`).toBe(true);
  let body: Json | undefined;
  if (text !== "") {
    try {
      body = JSON.parse(text) as Json;
    } catch {
      body = undefined;
    }
  }
  return { status: res.status, headers: res.headers, text, body };
}

const post = (path: string, token: string | undefined, json: unknown) =>
  call("POST", path, token, { json });

/** Every error a test saw, checked for leaks as it is asserted. */
function expectError(a: Answer, status: number, error: string, reason?: string): void {
  expect(a.status, a.text).toBe(status);
  const body = obj(a.body);
  expect(body.error, a.text).toBe(error);
  expect(body.message, a.text).toBeTypeOf("string");
  if (reason !== undefined) expect(body.reason, a.text).toBe(reason);
  expectNoLeak(a);
}

function expectNoLeak(a: Answer): void {
  for (const pattern of LEAKS) expect(a.text, `${pattern} in ${a.text}`).not.toMatch(pattern);
  expect(a.text).not.toContain(server.adminToken);
}

function expectJson(a: Answer, status: number): Json {
  expect(a.status, a.text).toBe(status);
  expect(a.headers.get("content-type") ?? "").toMatch(/application\/json/);
  return obj(a.body);
}

// ---------------------------------------------------------------- worker steps

interface Worker {
  token: string;
  workerId: string;
  workload: string;
}

async function registerWorker(workload = uniqueWorkload("rest"), extra: Json = {}) {
  const token = await newToken(TokenRole.WORKER);
  const a = await post("/workers/register", token, {
    name: `w-${workload}`,
    capabilities: [workload],
    cpu_count: 4,
    memory_mb: 2048,
    ...extra,
  });
  const body = expectJson(a, 200);
  return { token, workerId: String(body.worker_id), workload } satisfies Worker;
}

function claim(w: Worker, extra: Json = {}): Promise<Answer> {
  return post("/tasks/claim", w.token, {
    worker_id: w.workerId,
    capabilities: [w.workload],
    max_concurrency: 1,
    ...extra,
  });
}

async function claimOk(w: Worker, extra: Json = {}): Promise<Json> {
  return expectJson(await claim(w, extra), 200);
}

/** A worker holding attempt 1 of a fresh task of its own workload. */
async function leased(extra: Omit<CreateTaskInit, "workload"> = {}) {
  const w = await registerWorker();
  const task = await createTask(w.workload, extra);
  const claimed = await claimOk(w);
  expect(claimed.task_id).toBe(task.taskId);
  return { w, taskId: task.taskId, attempt: Number(claimed.attempt), claimed };
}

/** A PUT whose body is streamed in chunks (a ReadableStream, `duplex: "half"`). */
async function upload(
  w: Worker,
  taskId: string,
  attempt: number | string,
  filename: string,
  data: Uint8Array,
  headers: Record<string, string> = {},
  token: string | null = w.token,
): Promise<Answer> {
  let offset = 0;
  const chunk = 16 * 1024;
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (offset >= data.length) {
        controller.close();
        return;
      }
      controller.enqueue(data.slice(offset, offset + chunk));
      offset += chunk;
    },
  });
  const all: Record<string, string> = {
    "content-type": "text/csv",
    "x-worker-id": w.workerId,
    "x-task-attempt": String(attempt),
    ...headers,
  };
  if (token !== null) all.authorization = `Bearer ${token}`;
  const path = `/tasks/${taskId}/artifacts/${filename}`;
  const res = await fetch(`${server.url}${path}`, {
    method: "PUT",
    headers: all,
    body: stream,
    duplex: "half",
    redirect: "manual",
  });
  return answer(res, `PUT ${path}`);
}

interface Manifest {
  artifact_id: string;
  uri: string;
  sha256: string;
  content_type: string;
}

async function uploadOk(
  w: Worker,
  taskId: string,
  attempt: number,
  name: string,
  data: Uint8Array,
) {
  const a = await upload(w, taskId, attempt, name, data);
  const body = expectJson(a, 201);
  return {
    artifact_id: String(body.artifact_id),
    uri: String(body.uri),
    sha256: String(body.sha256),
    content_type: "text/csv",
  } satisfies Manifest;
}

function complete(w: Worker, taskId: string, attempt: number, result: unknown, extra: Json = {}) {
  return post(`/tasks/${taskId}/result`, w.token, {
    worker_id: w.workerId,
    attempt,
    result,
    metrics: { elapsed_seconds: 1.5, processed_rows: 10 },
    ...extra,
  });
}

/** The path of an absolute uri, on the coordinator under test (its public URL may differ). */
const onServer = (uri: string) => `${server.url}${new URL(uri).pathname}`;

async function download(path: string, token: string) {
  const res = await fetch(path, {
    headers: { authorization: `Bearer ${token}` },
    redirect: "manual",
  });
  expect(res.status >= 300 && res.status < 400).toBe(false);
  return {
    status: res.status,
    headers: res.headers,
    data: new Uint8Array(await res.arrayBuffer()),
  };
}

// ---------------------------------------------------------------- the contract

describe("the coordinator/worker REST contract", () => {
  it("registers a worker's capacity and answers a claim with the resources its lease holds", async () => {
    const w = await registerWorker(uniqueWorkload("rest"), { capacity: { gpu: 2 } });
    const worker = (await as(FleetService).getWorker({ workerId: w.workerId })).worker;
    expect(worker?.capacity).toEqual({ cpu: 4000n, memory: 2048n, gpu: 2n, slots: 1n });
    await createTask(w.workload, { resources: { gpu: 2n, memory: 1024n } });
    const claimed = await claimOk(w);
    expect(claimed.resources).toEqual({ gpu: 2, memory: 1024, slots: 1 });
  });

  it("registers a worker: 200 with a UUID worker_id and a positive integer heartbeat_interval_seconds", async () => {
    const token = await newToken(TokenRole.WORKER);
    const workload = uniqueWorkload("reg");
    const a = await post("/workers/register", token, {
      name: "lab-worker-01",
      capabilities: [workload],
      cpu_count: 8,
      memory_mb: 16384,
    });
    const body = expectJson(a, 200);
    expect(body.worker_id).toMatch(UUID);
    expect(Number.isInteger(body.heartbeat_interval_seconds)).toBe(true);
    expect(body.heartbeat_interval_seconds as number).toBeGreaterThan(0);
    const workerId = String(body.worker_id);

    const { worker } = await as(FleetService, token).getWorker({ workerId });
    expect(worker).toMatchObject({
      workerId,
      name: "lab-worker-01",
      capabilities: [workload],
      cpuCount: 8,
      memoryMb: 16384n,
    });

    // Registering again with worker_id updates that worker.
    const again = await post("/workers/register", token, {
      worker_id: workerId,
      name: "lab-worker-01",
      capabilities: [workload, "extra"],
      cpu_count: 8,
      memory_mb: 16384,
      max_concurrency: 3,
    });
    expect(expectJson(again, 200).worker_id).toBe(workerId);
    const updated = (await as(FleetService, token).getWorker({ workerId })).worker;
    expect(updated?.capabilities).toEqual([workload, "extra"]);
    expect(updated?.maxConcurrency).toBe(3);
  });

  it("answers a claim with 204 and an empty body when no compatible task is ready", async () => {
    const w = await registerWorker();
    const other = await createTask(uniqueWorkload("other"));
    const a = await claim(w);
    expect(a.status, a.text).toBe(204);
    expect(a.text).toBe("");
    expect(snapshot(await getTask(other.taskId))).toEqual(snapshot(other));

    // A claim for a worker that is not registered is 404.
    const unknown = await post("/tasks/claim", server.adminToken, {
      worker_id: randomUUID(),
      capabilities: [w.workload],
      max_concurrency: 1,
    });
    expectError(unknown, 404, "not_found");
  });

  it("answers a drained worker's claim with 204 while a compatible task is ready", async () => {
    const w = await registerWorker();
    const task = await createTask(w.workload);
    await as(FleetService, w.token).drainWorker({ workerId: w.workerId, drained: true });
    const a = await claim(w);
    expect(a.status, a.text).toBe(204);
    expect(a.text).toBe("");
    const after = await getTask(task.taskId);
    expect(after.state).toBe(TaskState.PENDING);
    expect(after.attempt).toBe(0);

    await as(FleetService, w.token).drainWorker({ workerId: w.workerId, drained: false });
    expect((await claimOk(w)).task_id).toBe(task.taskId);
  });

  it("claims a task: 200 with task_id, attempt 1, lease_expires_at, workload, input and parameters", async () => {
    const w = await registerWorker();
    const input = new TextEncoder().encode("CCO\nc1ccccc1\n");
    const parameters = { query_id: "CHEMBL939", top_k: 20, nested: { on: true, list: [1, "a"] } };
    const task = await createTask(w.workload, {
      input: { case: "inputData", value: input },
      parameters,
    });
    const before = Date.now();
    const body = await claimOk(w);

    expect(body.task_id).toBe(task.taskId);
    expect(body.task_id).toMatch(UUID);
    expect(body.attempt).toBe(1);
    expect(body.lease_expires_at).toMatch(WHOLE_SECONDS_UTC);
    expect(Date.parse(String(body.lease_expires_at))).toBeGreaterThan(before);
    expect(body.lease_token).toMatch(HEX64);
    expect(body.workload).toBe(w.workload);
    expect(body.parameters).toEqual(parameters);

    const ref = obj(body.input);
    expect(ref.sha256).toBe(sha(input));
    expect(ref.artifact_id).toMatch(UUID);
    expect(ref.size_bytes).toBe(input.length);
    expect(ref.uri).toBeTypeOf("string");
    const uri = new URL(String(ref.uri));
    expect(["http:", "https:"]).toContain(uri.protocol);
    expect(uri.pathname).toBe(`/artifacts/${ref.artifact_id}/download`);

    // What the worker then does with it: fetch the input and check its checksum.
    const viaUri = await download(onServer(String(ref.uri)), w.token);
    expect(viaUri.status).toBe(200);
    expect(sha(viaUri.data)).toBe(sha(input));
    const viaTask = await download(`${server.url}/tasks/${task.taskId}/input`, w.token);
    expect(viaTask.status).toBe(200);
    expect(sha(viaTask.data)).toBe(sha(input));

    const after = await getTask(task.taskId);
    expect(after.state).toBe(TaskState.RUNNING);
    expect(after.attempt).toBe(1);
    expect(after.lease?.workerId).toBe(w.workerId);
    // The expiry is the lease's, rounded down to the second.
    const expires = after.lease?.expiresAt ? timestampMs(after.lease.expiresAt) : 0;
    expect(Date.parse(String(body.lease_expires_at))).toBe(Math.floor(expires / 1000) * 1000);
  });

  it("claims a task without input or parameters: input null, parameters {}", async () => {
    const w = await registerWorker();
    const task = await createTask(w.workload);
    const body = await claimOk(w);
    expect(body.task_id).toBe(task.taskId);
    expect(body).toHaveProperty("input");
    expect(body.input).toBeNull();
    expect(body.parameters).toEqual({});
    expect((await getTask(task.taskId)).state).toBe(TaskState.RUNNING);
  });

  it("caps the leases held by a claim's max_concurrency; completing one frees a slot", async () => {
    const w = await registerWorker(undefined, { max_concurrency: 1 });
    const created: string[] = [];
    for (let i = 0; i < 3; i++) created.push((await createTask(w.workload)).taskId);

    const first = await claimOk(w, { max_concurrency: 2 });
    const second = await claimOk(w, { max_concurrency: 2 });
    const third = await claim(w, { max_concurrency: 2 });
    expect(third.status, third.text).toBe(204);
    expect(third.text).toBe("");
    const held = [String(first.task_id), String(second.task_id)];
    expect(new Set(held).size).toBe(2);
    const left = created.find((id) => !held.includes(id));
    if (!left) throw new Error("no task left over");
    expect((await getTask(left)).state).toBe(TaskState.PENDING);

    const done = held[0] as string;
    const m = await uploadOk(w, done, 1, "out.csv", bytes(10));
    expectJson(await complete(w, done, 1, m), 200);
    const fourth = await claimOk(w, { max_concurrency: 2 });
    expect(fourth.task_id).toBe(left);
    expect((await getTask(left)).state).toBe(TaskState.RUNNING);
  });

  it("renews a lease on heartbeat: 200 with a lease_expires_at not earlier than before", async () => {
    const { w, taskId, claimed } = await leased();
    const a = await post(`/tasks/${taskId}/heartbeat`, w.token, {
      worker_id: w.workerId,
      attempt: 1,
    });
    const body = expectJson(a, 200);
    expect(body.lease_expires_at).toMatch(WHOLE_SECONDS_UTC);
    expect(Date.parse(String(body.lease_expires_at))).toBeGreaterThanOrEqual(
      Date.parse(String(claimed.lease_expires_at)),
    );
    expect(body.cancel_requested).toBe(false);

    // With the lease token, extend_seconds, and a null that counts as absent.
    const longer = await post(`/tasks/${taskId}/heartbeat`, w.token, {
      worker_id: w.workerId,
      attempt: 1,
      lease_token: claimed.lease_token,
      extend_seconds: 3600,
    });
    const extended = expectJson(longer, 200);
    expect(extended.lease_expires_at).toMatch(WHOLE_SECONDS_UTC);
    expect(Date.parse(String(extended.lease_expires_at))).toBeGreaterThan(Date.now() + 3000 * 1000);
    const nulls = await post(`/tasks/${taskId}/heartbeat`, w.token, {
      worker_id: w.workerId,
      attempt: 1,
      lease_token: null,
    });
    expect(expectJson(nulls, 200).lease_expires_at).toMatch(WHOLE_SECONDS_UTC);

    const after = await getTask(taskId);
    expect(after.state).toBe(TaskState.RUNNING);
    expect(after.attempt).toBe(1);
  });

  it("refuses another registered worker's heartbeat, completion and failure: 409 aborted FOREIGN_WORKER", async () => {
    const { w, taskId } = await leased();
    const manifest = await uploadOk(w, taskId, 1, "out.csv", bytes(64));
    const other = await registerWorker(w.workload);
    const before = snapshot(await getTask(taskId));

    const beat = await post(`/tasks/${taskId}/heartbeat`, other.token, {
      worker_id: other.workerId,
      attempt: 1,
    });
    expectError(beat, 409, "aborted", "FOREIGN_WORKER");
    const done = await complete(other, taskId, 1, manifest);
    expectError(done, 409, "aborted", "FOREIGN_WORKER");
    const failed = await post(`/tasks/${taskId}/failure`, other.token, {
      worker_id: other.workerId,
      attempt: 1,
      error_code: "Stolen",
      error_message: "not mine",
    });
    expectError(failed, 409, "aborted", "FOREIGN_WORKER");

    expect(snapshot(await getTask(taskId))).toEqual(before);
    // The holder is unaffected.
    expect(expectJson(await complete(w, taskId, 1, manifest), 200).state).toBe("succeeded");
  });

  it("refuses a stale attempt: 409 aborted STALE_ATTEMPT, the task unchanged", async () => {
    const { w, taskId } = await leased();
    const before = snapshot(await getTask(taskId));

    const beat = await post(`/tasks/${taskId}/heartbeat`, w.token, {
      worker_id: w.workerId,
      attempt: 2,
    });
    expectError(beat, 409, "aborted", "STALE_ATTEMPT");
    const failed = await post(`/tasks/${taskId}/failure`, w.token, {
      worker_id: w.workerId,
      attempt: 2,
      error_code: "Late",
      error_message: "from the future",
    });
    expectError(failed, 409, "aborted", "STALE_ATTEMPT");

    const after = await getTask(taskId);
    expect(snapshot(after)).toEqual(before);
    expect(after.state).toBe(TaskState.RUNNING);
    expect(after.attempt).toBe(1);
  });

  it("refuses a worker token acting for a worker registered with another token: 403 permission_denied", async () => {
    const { w, taskId } = await leased();
    const pending = await createTask(w.workload);
    const intruder = await newToken(TokenRole.WORKER);
    const before = snapshot(await getTask(taskId));

    const claimed = await post("/tasks/claim", intruder, {
      worker_id: w.workerId,
      capabilities: [w.workload],
      max_concurrency: 5,
    });
    expectError(claimed, 403, "permission_denied", "FOREIGN_WORKER_TOKEN");
    const beat = await post(`/tasks/${taskId}/heartbeat`, intruder, {
      worker_id: w.workerId,
      attempt: 1,
    });
    expectError(beat, 403, "permission_denied", "FOREIGN_WORKER_TOKEN");
    const failed = await post(`/tasks/${taskId}/failure`, intruder, {
      worker_id: w.workerId,
      attempt: 1,
      error_code: "X",
      error_message: "x",
    });
    expectError(failed, 403, "permission_denied", "FOREIGN_WORKER_TOKEN");
    const put = await upload(w, taskId, 1, "out.csv", bytes(8), {}, intruder);
    expectError(put, 403, "permission_denied");
    const reregister = await post("/workers/register", intruder, {
      worker_id: w.workerId,
      name: "hijack",
      capabilities: ["x"],
      cpu_count: 1,
      memory_mb: 1,
    });
    expectError(reregister, 403, "permission_denied");

    expect(snapshot(await getTask(taskId))).toEqual(before);
    expect((await getTask(pending.taskId)).state).toBe(TaskState.PENDING);
    const worker = (await as(FleetService).getWorker({ workerId: w.workerId })).worker;
    expect(worker?.capabilities).toEqual([w.workload]);
  });

  it("refuses a request without a valid token: 401 unauthenticated on every route", async () => {
    const { w, taskId } = await leased();
    const before = snapshot(await getTask(taskId));
    for (const token of [undefined, "nope", `mw_${"A".repeat(43)}`]) {
      const answers = [
        await post("/workers/register", token, {
          name: "n",
          capabilities: ["x"],
          cpu_count: 1,
          memory_mb: 1,
        }),
        await post("/tasks/claim", token, {
          worker_id: w.workerId,
          capabilities: [w.workload],
          max_concurrency: 1,
        }),
        await post(`/tasks/${taskId}/heartbeat`, token, { worker_id: w.workerId, attempt: 1 }),
        await post(`/tasks/${taskId}/failure`, token, {
          worker_id: w.workerId,
          attempt: 1,
          error_code: "E",
          error_message: "m",
        }),
        await upload(w, taskId, 1, "out.csv", bytes(8), {}, token ?? null),
        await call("GET", `/tasks/${taskId}/input`, token),
      ];
      for (const a of answers) expectError(a, 401, "unauthenticated");
    }
    expect(snapshot(await getTask(taskId))).toEqual(before);
  });

  it("refuses a client-role token on /tasks/claim: 403 permission_denied", async () => {
    const w = await registerWorker();
    const task = await createTask(w.workload);
    const client = await newToken(TokenRole.CLIENT);
    const a = await post("/tasks/claim", client, {
      worker_id: w.workerId,
      capabilities: [w.workload],
      max_concurrency: 1,
    });
    expectError(a, 403, "permission_denied");
    const reg = await post("/workers/register", client, {
      name: "c",
      capabilities: [w.workload],
      cpu_count: 1,
      memory_mb: 1,
    });
    expectError(reg, 403, "permission_denied");
    const after = await getTask(task.taskId);
    expect(after.state).toBe(TaskState.PENDING);
    expect(after.attempt).toBe(0);
  });

  it("stores a streamed upload: 201 with artifact_id, uri, sha256 and size_bytes", async () => {
    const { w, taskId } = await leased();
    const data = bytes(300_000, 7);
    const a = await upload(w, taskId, 1, "similarity.csv", data, { "x-content-sha256": sha(data) });
    const body = expectJson(a, 201);
    expect(body.artifact_id).toMatch(UUID);
    expect(body.sha256).toBe(sha(data));
    expect(body.size_bytes).toBe(data.length);
    expect(body.uri).toBeTypeOf("string");
    const uri = new URL(String(body.uri));
    expect(["http:", "https:"]).toContain(uri.protocol);
    expect(uri.pathname).toBe(`/artifacts/${body.artifact_id}/download`);
    expect(a.headers.get("location")).toBe(body.uri);

    const listed = await as(ArtifactService).listArtifacts({ taskId });
    expect(listed.artifacts.map((x) => x.artifactId)).toEqual([body.artifact_id]);
    expect(listed.artifacts[0]?.contentType).toBe("text/csv");
    const back = await download(onServer(String(body.uri)), w.token);
    expect(back.status).toBe(200);
    expect(sha(back.data)).toBe(sha(data));
    expect((await getTask(taskId)).state).toBe(TaskState.RUNNING);
  });

  it("refuses an upload whose X-Content-SHA256 does not match its body: 400, nothing stored", async () => {
    const { w, taskId } = await leased();
    const data = bytes(50_000, 3);
    const a = await upload(w, taskId, 1, "out.csv", data, { "x-content-sha256": sha("other") });
    expectError(a, 400, "invalid_argument");
    expect((await as(ArtifactService).listArtifacts({ taskId })).artifacts).toEqual([]);
    const after = await getTask(taskId);
    expect(after.state).toBe(TaskState.RUNNING);
    expect(after.attempt).toBe(1);

    // The refused bytes cannot name a result: no artifact was issued for them.
    const good = await uploadOk(w, taskId, 1, "good.csv", bytes(10));
    const ghost = randomUUID();
    const base = String(good.uri).slice(0, String(good.uri).indexOf("/artifacts/"));
    const refused = await complete(w, taskId, 1, {
      artifact_id: ghost,
      uri: `${base}/artifacts/${ghost}/download`,
      sha256: sha(data),
      content_type: "text/csv",
    });
    expectError(refused, 409, "aborted", "ARTIFACT_MISMATCH");
    expect((await as(ArtifactService).listArtifacts({ taskId })).artifacts).toHaveLength(1);
    expect((await getTask(taskId)).state).toBe(TaskState.RUNNING);
  });

  it("completes a task with the uploaded artifact: 200, SUCCEEDED, and GET /tasks/{id}/result serves the bytes", async () => {
    const { w, taskId } = await leased();
    const data = new TextEncoder().encode("id,score\nCHEMBL1,0.93\n");
    const m = await uploadOk(w, taskId, 1, "result.csv", data);
    const a = await complete(w, taskId, 1, m, { result_summary: "1 hit" });
    expect(expectJson(a, 200)).toEqual({ task_id: taskId, attempt: 1, state: "succeeded" });

    const after = await getTask(taskId);
    expect(after.state).toBe(TaskState.SUCCEEDED);
    expect(after.result?.artifactId).toBe(m.artifact_id);
    expect(after.result?.sha256).toBe(sha(data));
    expect(after.resultSummary).toBe("1 hit");
    expect(after.metrics).toEqual({ elapsed_seconds: 1.5, processed_rows: 10 });

    const result = await download(`${server.url}/tasks/${taskId}/result`, w.token);
    expect(result.status).toBe(200);
    expect(result.data).toEqual(data);
    expect(result.headers.get("x-content-sha256")).toBe(sha(data));
  });

  it("takes an identical completion again (200) and refuses a different one for the same attempt (409 already_exists)", async () => {
    const { w, taskId } = await leased();
    const first = await uploadOk(w, taskId, 1, "a.csv", bytes(20, 1));
    const second = await uploadOk(w, taskId, 1, "b.csv", bytes(20, 2));
    const done = expectJson(await complete(w, taskId, 1, first), 200);
    expect(done.state).toBe("succeeded");
    const settled = snapshot(await getTask(taskId));

    const again = await complete(w, taskId, 1, first);
    expect(expectJson(again, 200)).toEqual(done);

    const otherArtifact = await complete(w, taskId, 1, second);
    expectError(otherArtifact, 409, "already_exists", "COMPLETION_CONFLICT");
    const otherType = await complete(w, taskId, 1, { ...first, content_type: "text/plain" });
    expectError(otherType, 409, "already_exists", "COMPLETION_CONFLICT");
    const otherMetrics = await complete(w, taskId, 1, first, { metrics: { processed_rows: 11 } });
    expectError(otherMetrics, 409, "already_exists", "COMPLETION_CONFLICT");

    const after = await getTask(taskId);
    expect(snapshot(after)).toEqual(settled);
    expect(after.result?.artifactId).toBe(first.artifact_id);
    expect(after.metrics).toEqual({ elapsed_seconds: 1.5, processed_rows: 10 });
    const result = await download(`${server.url}/tasks/${taskId}/result`, w.token);
    expect(result.data).toEqual(bytes(20, 1));
  });

  it("refuses a result naming an artifact of another task: 409 aborted ARTIFACT_MISMATCH", async () => {
    const w = await registerWorker(undefined, { max_concurrency: 2 });
    await createTask(w.workload);
    await createTask(w.workload);
    const x = String((await claimOk(w, { max_concurrency: 2 })).task_id);
    const y = String((await claimOk(w, { max_concurrency: 2 })).task_id);
    const ofX = await uploadOk(w, x, 1, "x.csv", bytes(30));
    const before = snapshot(await getTask(y));

    const a = await complete(w, y, 1, ofX);
    expectError(a, 409, "aborted", "ARTIFACT_MISMATCH");
    // The right artifact with another checksum is refused the same way.
    const ofY = await uploadOk(w, y, 1, "y.csv", bytes(30, 9));
    const wrongSum = await complete(w, y, 1, { ...ofY, sha256: sha("something else") });
    expectError(wrongSum, 409, "aborted", "ARTIFACT_MISMATCH");

    const after = await getTask(y);
    expect(after.state).toBe(TaskState.RUNNING);
    expect({ ...snapshot(after), updatedAt: 0 }).toEqual({ ...before, updatedAt: 0 });
    expect((await getTask(x)).state).toBe(TaskState.RUNNING);
  });

  it("refuses file:// and worker:// (and another host's) result uris: 400, the task still RUNNING", async () => {
    const { w, taskId } = await leased();
    const m = await uploadOk(w, taskId, 1, "out.csv", bytes(40));
    const before = snapshot(await getTask(taskId));
    const path = new URL(m.uri).pathname;
    for (const uri of [
      "file:///home/alice/out.csv",
      `worker://${w.workerId}/out.csv`,
      `https://elsewhere.example${path}`,
    ]) {
      const a = await complete(w, taskId, 1, { ...m, uri });
      expectError(a, 400, "invalid_argument");
      expect(a.text).not.toContain("/home/alice");
    }
    const after = await getTask(taskId);
    expect(after.state).toBe(TaskState.RUNNING);
    expect(snapshot(after)).toEqual(before);
  });

  it("fails through /failure: pending with retry_at while attempts are left, then failed; the message stored sanitised", async () => {
    const w = await registerWorker();
    const task = await createTask(w.workload, { maxAttempts: 2 });
    expect((await claimOk(w)).attempt).toBe(1);
    const secret = `mw_abc${randomBytes(30).toString("base64url").slice(0, 40)}`;
    const message =
      "could not read /home/alice/secret.txt with Authorization: Bearer " +
      `${secret}\nTraceback (most recent call last):\n  File "/home/alice/w.py", line 3`;

    const first = await post(`/tasks/${task.taskId}/failure`, w.token, {
      worker_id: w.workerId,
      attempt: 1,
      error_code: "ValueError",
      error_message: message,
    });
    const body = expectJson(first, 200);
    expect(body).toMatchObject({ task_id: task.taskId, attempt: 1, state: "pending" });
    expect(body.retry_at).toMatch(WHOLE_SECONDS_UTC);
    const pending = await getTask(task.taskId);
    expect(pending.state).toBe(TaskState.PENDING);
    const notBefore = pending.notBefore ? timestampMs(pending.notBefore) : 0;
    expect(Math.abs(Date.parse(String(body.retry_at)) - notBefore)).toBeLessThan(1000);
    expect(pending.error?.code).toBe("ValueError");
    for (const leak of ["/home/alice/secret.txt", "/home/alice", "mw_abc", secret]) {
      expect(pending.error?.message ?? "").not.toContain(leak);
    }

    // The retry is claimable once its backoff ends (a long poll, bounded).
    const retried = await claimOk(w, { wait_seconds: 10 });
    expect(retried).toMatchObject({ task_id: task.taskId, attempt: 2 });
    const last = await post(`/tasks/${task.taskId}/failure`, w.token, {
      worker_id: w.workerId,
      attempt: 2,
      error_code: "ValueError",
      error_message: `Traceback (most recent call last):\n  File "/home/alice/run.py", line 7, in <module>\n    load(Bearer ${secret})\nValueError: bad input at row 7`,
    });
    const final = expectJson(last, 200);
    expect(final).toMatchObject({ task_id: task.taskId, attempt: 2, state: "failed" });
    expect(final.retry_at ?? null).toBeNull();
    const failed = await getTask(task.taskId);
    expect(failed.state).toBe(TaskState.FAILED);
    // The exception line, the one that says what went wrong, is kept; the frames go.
    expect(failed.error?.message).toBe("ValueError: bad input at row 7");
  });

  it("fails at once through /failure with retryable false", async () => {
    const { w, taskId } = await leased({ maxAttempts: 3 });
    const a = await post(`/tasks/${taskId}/failure`, w.token, {
      worker_id: w.workerId,
      attempt: 1,
      error_code: "BadInput",
      error_message: "input checksum mismatch",
      retryable: false,
    });
    expect(expectJson(a, 200)).toMatchObject({ task_id: taskId, attempt: 1, state: "failed" });
    expect((await getTask(taskId)).state).toBe(TaskState.FAILED);
  });

  it("refuses invalid JSON with 400 {error: invalid_argument, message}, on every route, changing nothing", async () => {
    const { w, taskId } = await leased();
    const waiting = await createTask(w.workload);
    const before = snapshot(await getTask(taskId));
    for (const path of [
      "/workers/register",
      "/tasks/claim",
      `/tasks/${taskId}/heartbeat`,
      `/tasks/${taskId}/result`,
      `/tasks/${taskId}/failure`,
    ]) {
      for (const raw of ['{"worker_id": ', "not json", "[1,2]"]) {
        const a = await call("POST", path, w.token, { raw });
        expectError(a, 400, "invalid_argument");
        expect(Object.keys(obj(a.body)).sort()).toEqual(
          Object.keys(obj(a.body)).includes("reason")
            ? ["error", "message", "reason"]
            : ["error", "message"],
        );
      }
    }
    expect(snapshot(await getTask(taskId))).toEqual(before);
    expect((await getTask(waiting.taskId)).state).toBe(TaskState.PENDING);
  });

  it("refuses an unknown (misspelt) field with 400, changing nothing", async () => {
    const { w, taskId } = await leased();
    const waiting = await createTask(w.workload);
    const before = snapshot(await getTask(taskId));
    const answers = [
      await post("/tasks/claim", w.token, {
        worker_id: w.workerId,
        capabilities: [w.workload],
        max_concurency: 2,
      }),
      await post(`/tasks/${taskId}/heartbeat`, w.token, {
        worker_id: w.workerId,
        attempt: 1,
        extend_secs: 600,
      }),
      await post(`/tasks/${taskId}/failure`, w.token, {
        worker_id: w.workerId,
        attempt: 1,
        error_code: "E",
        error_mesage: "typo",
      }),
      await post("/workers/register", w.token, {
        worker_id: w.workerId,
        name: "n",
        capabilities: [w.workload],
        cpu_count: 1,
        memory_mb: 1,
        colour: "blue",
      }),
    ];
    for (const a of answers) expectError(a, 400, "invalid_argument");
    expect(snapshot(await getTask(taskId))).toEqual(before);
    const still = await getTask(waiting.taskId);
    expect(still.state).toBe(TaskState.PENDING);
    expect(still.attempt).toBe(0);
  });

  it("refuses attempt as a string with 400, changing nothing", async () => {
    const { w, taskId } = await leased();
    const before = snapshot(await getTask(taskId));
    const beat = await post(`/tasks/${taskId}/heartbeat`, w.token, {
      worker_id: w.workerId,
      attempt: "1",
    });
    expectError(beat, 400, "invalid_argument");
    const failed = await post(`/tasks/${taskId}/failure`, w.token, {
      worker_id: w.workerId,
      attempt: "1",
      error_code: "E",
      error_message: "m",
    });
    expectError(failed, 400, "invalid_argument");
    expect(snapshot(await getTask(taskId))).toEqual(before);
  });

  it("refuses a task_id that is not a UUID with 400, and an unknown task with 404", async () => {
    const { w, taskId } = await leased();
    const before = snapshot(await getTask(taskId));
    for (const route of ["heartbeat", "result", "failure"]) {
      const body = {
        worker_id: w.workerId,
        attempt: 1,
        ...(route === "failure" && { error_code: "E", error_message: "m" }),
      };
      expectError(await post(`/tasks/not-a-uuid/${route}`, w.token, body), 400, "invalid_argument");
      expectError(await post(`/tasks/${randomUUID()}/${route}`, w.token, body), 404, "not_found");
    }
    const put = await upload(w, "not-a-uuid", 1, "out.csv", bytes(8));
    expectError(put, 400, "invalid_argument");
    const putUnknown = await upload(w, randomUUID(), 1, "out.csv", bytes(8));
    expectError(putUnknown, 404, "not_found");
    expect(snapshot(await getTask(taskId))).toEqual(before);
  });

  it("never shows SQL, a stack trace, a file path or a token in an error body", async () => {
    const { w, taskId } = await leased();
    const answers = [
      await call("POST", "/tasks/claim", w.token, { raw: "{'worker_id': 1}" }),
      await post("/tasks/claim", w.token, { worker_id: "'; drop table tasks; --" }),
      await post("/tasks/claim", w.token, { worker_id: w.workerId, max_concurrency: 1e12 }),
      await post(`/tasks/${taskId}/heartbeat`, w.token, { worker_id: w.workerId, attempt: -1 }),
      await post(`/tasks/${taskId}/heartbeat`, w.token, { worker_id: w.workerId, attempt: 1.5 }),
      await post(`/tasks/${taskId}/heartbeat`, w.token, { worker_id: [], attempt: {} }),
      await post(`/tasks/${taskId}/heartbeat`, w.token, {
        worker_id: w.workerId,
        attempt: 1,
        extend_seconds: 1,
      }),
      await post(`/tasks/${randomUUID()}/heartbeat`, w.token, {
        worker_id: w.workerId,
        attempt: 1,
      }),
      await complete(w, taskId, 1, { artifact_id: "x", uri: "file:///work/secret", sha256: "z" }),
      await post("/workers/register", w.token, { capabilities: "not-a-list" }),
      await post("/workers/register", w.token, { name: "n\u0000", capabilities: [] }),
      await post("/tasks/claim", undefined, {}),
      await upload(w, taskId, "one", "out.csv", bytes(4)),
      await upload(w, taskId, 1, "bad%20name.csv", bytes(4)),
      await upload(w, taskId, 1, ".hidden", bytes(4)),
    ];
    for (const a of answers) {
      expect(a.status, a.text).toBeGreaterThanOrEqual(400);
      expect(a.status, a.text).toBeLessThan(500);
      expect(obj(a.body).error, a.text).toBeTypeOf("string");
      expect(obj(a.body).message, a.text).toBeTypeOf("string");
      expectNoLeak(a);
      expect(a.text).not.toContain(w.token);
    }
    expect((await getTask(taskId)).state).toBe(TaskState.RUNNING);
  });

  it("does not redirect: a trailing slash is 404, not 3xx", async () => {
    const w = await registerWorker();
    const task = await createTask(w.workload);
    const claimBody = { worker_id: w.workerId, capabilities: [w.workload], max_concurrency: 1 };
    const slash = await post("/tasks/claim/", w.token, claimBody);
    expect(slash.status, slash.text).toBe(404);
    expect(slash.headers.get("location")).toBeNull();
    const register = await post("/workers/register/", w.token, {
      name: "n",
      capabilities: [w.workload],
      cpu_count: 1,
      memory_mb: 1,
    });
    expect(register.status, register.text).toBe(404);
    const beat = await post(`/tasks/${task.taskId}/heartbeat/`, w.token, {
      worker_id: w.workerId,
      attempt: 1,
    });
    expect(beat.status, beat.text).toBe(404);
    // Nothing was claimed through the slashed path.
    expect((await getTask(task.taskId)).state).toBe(TaskState.PENDING);
    expect((await claimOk(w)).task_id).toBe(task.taskId);
  });
});

describe("the coordinator/worker REST contract: workflows", () => {
  async function until(check: () => Promise<boolean>, what: string): Promise<void> {
    for (let i = 0; i < 200; i++) {
      if (await check()) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`gave up waiting for ${what}`);
  }

  it("hands a claim its dependency_outputs and timeout_seconds, serves each output on the input route, and takes a result_value", async () => {
    const w = await registerWorker();
    const { tasks } = await as(TaskService).createTasks({
      tasks: [
        { workload: w.workload, ref: "split" },
        { workload: w.workload, ref: "join", dependsOn: ["ref:split"], timeoutSeconds: 600 },
      ],
    });
    const [split, join] = tasks.map((t) => t.taskId);
    const first = await claimOk(w);
    expect(first).toMatchObject({ task_id: split, dependency_outputs: {}, timeout_seconds: 0 });
    const scene = new TextEncoder().encode("scene,1\n");
    const m = await uploadOk(w, split ?? "", 1, "scene.csv", scene);
    const done = await complete(w, split ?? "", 1, m, { result_value: { rows: 1 } });
    expect(expectJson(done, 200)).toEqual({ task_id: split, attempt: 1, state: "succeeded" });

    const second = await claimOk(w);
    expect(second.task_id).toBe(join);
    expect(second.timeout_seconds).toBe(600);
    expect(second.dependency_outputs).toEqual({
      "split/scene.csv": m.artifact_id,
      "split/result": m.artifact_id,
    });
    // The input route serves each by its name; the name as one encoded segment too.
    for (const name of ["split/scene.csv", "split/result", "split%2Fscene.csv"]) {
      const got = await download(`${server.url}/tasks/${join}/input/${name}`, w.token);
      expect(got.status, name).toBe(200);
      expect(got.data).toEqual(scene);
      expect(got.headers.get("etag")).toBe(`"${sha(scene)}"`);
    }
    const missing = await call("GET", `/tasks/${join}/input/split/other.csv`, w.token);
    expectError(missing, 404, "not_found");
    expectError(await call("GET", `/tasks/${join}/input/nowhere`, w.token), 404, "not_found");
    expectError(
      await call("GET", `/tasks/not-a-task/input/split/result`, w.token),
      400,
      "invalid_argument",
    );
    expect((await call("GET", `/tasks/${join}/input/split/result`, undefined)).status).toBe(401);

    const value = { hits: 3, best: { id: "P12345", score: 0.97 }, tags: ["a", "b"], none: null };
    const joined = await complete(w, join ?? "", 1, null, { result_value: value });
    expect(expectJson(joined, 200).state).toBe("succeeded");
    expect((await getTask(join ?? "")).resultValue).toEqual(value);
    expect((await getTask(split ?? "")).resultValue).toEqual({ rows: 1 });
    // The identical completion again is 200; another value for the attempt is 409.
    expect((await complete(w, join ?? "", 1, null, { result_value: value })).status).toBe(200);
    const other = await complete(w, join ?? "", 1, null, { result_value: { hits: 4 } });
    expectError(other, 409, "already_exists", "COMPLETION_CONFLICT");
  });

  it("refuses a result_value over 64 KiB or not a JSON object: 400, the task still RUNNING", async () => {
    const { w, taskId, attempt } = await leased();
    const before = snapshot(await getTask(taskId));
    for (const bad of [{ s: "x".repeat(70_000) }, "text", [1, 2], 3]) {
      const a = await complete(w, taskId, attempt, null, { result_value: bad });
      expectError(a, 400, "invalid_argument");
    }
    const after = await getTask(taskId);
    expect(snapshot(after)).toEqual(before);
    expect(after.resultValue).toBeUndefined();
    const ok = await complete(w, taskId, attempt, null, {
      result_value: { s: "x".repeat(60_000) },
    });
    expect(expectJson(ok, 200).state).toBe("succeeded");
  });

  it("answers a heartbeat or completion after the attempt's timeout with 409 aborted TIMEOUT", async () => {
    const { w, taskId, attempt, claimed } = await leased({ timeoutSeconds: 1, maxAttempts: 1 });
    expect(claimed.timeout_seconds).toBe(1);
    const beat = { worker_id: w.workerId, attempt };
    expect((await post(`/tasks/${taskId}/heartbeat`, w.token, beat)).status).toBe(200);
    // The sweeper (every second here) fails the attempt once it has run past its bound.
    await until(async () => (await getTask(taskId)).state === TaskState.FAILED, "the timeout");
    const timedOut = await getTask(taskId);
    expect(timedOut.error?.code).toBe("TIMEOUT");
    expectError(await post(`/tasks/${taskId}/heartbeat`, w.token, beat), 409, "aborted", "TIMEOUT");
    const late = await complete(w, taskId, attempt, null, { result_value: { late: true } });
    expectError(late, 409, "aborted", "TIMEOUT");
    const failure = await post(`/tasks/${taskId}/failure`, w.token, {
      ...beat,
      error_code: "Late",
      error_message: "too late",
    });
    expectError(failure, 409, "aborted", "TIMEOUT");
    expect(snapshot(await getTask(taskId))).toEqual(snapshot(timedOut));
  });
});
