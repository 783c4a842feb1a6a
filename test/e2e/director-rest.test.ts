import { createHash, randomBytes, randomUUID } from "node:crypto";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { beforeAll, describe, expect, it } from "vitest";
import { TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { useListeningServer } from "../support/server.js";

// The director contract under /api/mesh (docs/rest.md, "The director
// contract"), called the way a director written against that document calls
// it: plain fetch, camelCase JSON bodies, bearer tokens of each role, no
// redirects followed. Every test uses its own peer ids, brick ids and keys,
// so that tests sharing the file's database do not see each other's data.

const server = useListeningServer({ auth: "on" });

type Body = Record<string, unknown>;

interface Answer<T = Body> {
  status: number;
  headers: Headers;
  text: string;
  body: T;
}

interface FleetNode {
  peerId: string;
  workerId: string;
  name: string;
  apiBaseUrl: string;
  labels: Record<string, string>;
  advertisedBrickIds: string[];
  drained: boolean;
  state: string;
  queueDepth: number;
  activeLeases: number;
  maxConcurrency: number | null;
  cpuCount: number;
  memoryMb: number;
  registeredUtc: string;
  lastHeartbeatUtc: string;
}

interface MeshTask {
  taskId: string;
  name: string;
  status: string;
  workload: string;
  steps: number;
  requiredBrickIds: string[];
  affinity: Record<string, string>;
  priority: number;
  deadlineUtc: string | null;
  parameters: Body | null;
  idempotencyKey: string | null;
  correlationId: string | null;
  attempt: number;
  maxAttempts: number;
  leaseSeconds: number;
  leaseToken: string | null;
  leaseOwnerPeerId: string | null;
  leaseExpiresUtc: string | null;
  checkpointHandle: string | null;
  assignedPeerId: string | null;
  assignedApiBaseUrl: string | null;
  progress: { completedSteps: number; message: string };
  resultSummary: string | null;
  resultHandle: string | null;
  result: { uri: string; sha256: string; sizeBytes: number; contentType: string } | null;
  errorCode: string | null;
  errorMessage: string | null;
  cancelRequested: boolean;
  createdUtc: string;
  updatedUtc: string;
  startedUtc: string | null;
  finishedUtc: string | null;
}

interface ErrorBody {
  error: string;
  message: string;
  reason?: string;
}

interface Uploaded {
  artifact_id: string;
  uri: string;
  sha256: string;
  size_bytes: number;
}

interface ImportCounts {
  inserted: number;
  updated: number;
  unchanged: number;
  rejected: number;
  rejections: { group: string; index: number; key: string; reason: string }[];
}

interface KnowledgeEntry {
  kind: string;
  key: string;
  value: Body;
  version: number;
  updatedAt: string;
  origin: string;
}

const NODE_FIELDS = [
  "peerId",
  "workerId",
  "name",
  "apiBaseUrl",
  "labels",
  "advertisedBrickIds",
  "drained",
  "state",
  "queueDepth",
  "activeLeases",
  "maxConcurrency",
  "cpuCount",
  "memoryMb",
  "registeredUtc",
  "lastHeartbeatUtc",
];

const TASK_FIELDS = [
  "taskId",
  "name",
  "status",
  "workload",
  "steps",
  "requiredBrickIds",
  "affinity",
  "priority",
  "deadlineUtc",
  "parameters",
  "idempotencyKey",
  "correlationId",
  "attempt",
  "maxAttempts",
  "leaseSeconds",
  "leaseToken",
  "leaseOwnerPeerId",
  "leaseExpiresUtc",
  "checkpointHandle",
  "assignedPeerId",
  "assignedApiBaseUrl",
  "progress",
  "resultSummary",
  "resultHandle",
  "result",
  "errorCode",
  "errorMessage",
  "cancelRequested",
  "createdUtc",
  "updatedUtc",
  "startedUtc",
  "finishedUtc",
];

/** RFC 3339 UTC with milliseconds, as docs/rest.md says director times are. */
const MILLIS_UTC = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** A bound on every request, so that a stuck call fails the test instead of hanging it. */
const REQUEST_BOUND_MS = 20_000;

const uid = () => randomBytes(5).toString("hex");
const sha256 = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");

let clientToken = "";
let workerToken = "";
let otherWorkerToken = "";

async function makeToken(role: TokenRole, name: string): Promise<string> {
  const tokens = createClient(
    TokenService,
    createConnectTransport({
      baseUrl: server.url,
      httpVersion: "1.1",
      interceptors: [
        (next) => (req) => {
          req.header.set("authorization", `Bearer ${server.adminToken}`);
          return next(req);
        },
      ],
    }),
  );
  const { secret } = await tokens.createToken({ name: `${name}-${uid()}`, role });
  return secret;
}

beforeAll(async () => {
  clientToken = await makeToken(TokenRole.CLIENT, "director");
  workerToken = await makeToken(TokenRole.WORKER, "worker-a");
  otherWorkerToken = await makeToken(TokenRole.WORKER, "worker-b");
});

interface CallOptions {
  /** The bearer token; `null` sends no Authorization header. Default: the admin token. */
  token?: string | null;
  /** A JSON body (serialised here). */
  json?: unknown;
  /** A body sent as is. */
  raw?: string | Uint8Array;
  headers?: Record<string, string>;
}

async function call<T = Body>(
  method: string,
  path: string,
  options: CallOptions = {},
): Promise<Answer<T>> {
  const headers: Record<string, string> = { ...options.headers };
  const token = options.token === undefined ? server.adminToken : options.token;
  if (token !== null) headers.authorization = `Bearer ${token}`;
  let body: string | Uint8Array | undefined;
  if (options.json !== undefined) {
    body = JSON.stringify(options.json);
    headers["content-type"] = "application/json";
  } else if (options.raw !== undefined) {
    body = options.raw;
    headers["content-type"] ??= "application/json";
  }
  const res = await fetch(`${server.url}${path}`, {
    method,
    headers,
    body,
    redirect: "manual",
    signal: AbortSignal.timeout(REQUEST_BOUND_MS),
  });
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = text === "" ? undefined : JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  return { status: res.status, headers: res.headers, text, body: parsed as T };
}

const mesh = <T = Body>(method: string, path: string, options: CallOptions = {}) =>
  call<T>(method, `/api/mesh${path}`, options);

/** The status and error fields of an answer, for one readable comparison. */
function refusal(a: Answer<unknown>): { status: number; error: unknown; message: unknown } & Body {
  const b = (a.body ?? {}) as Body;
  return {
    status: a.status,
    error: b.error,
    message: typeof b.message,
    ...(b.reason === undefined ? {} : { reason: b.reason }),
  };
}

/** Asserts a documented error answer: the status, `{"error", "message"}`, and the reason if given. */
function expectRefusal(a: Answer<unknown>, status: number, error: string, reason?: string): void {
  expect(refusal(a), `answer was ${a.status} ${a.text}`).toMatchObject({
    status,
    error,
    message: "string",
    ...(reason === undefined ? {} : { reason }),
  });
}

function expectOk<T>(a: Answer<T>, status = 200): T {
  expect(a.status, `answer was ${a.status} ${a.text}`).toBe(status);
  return a.body;
}

interface NodeRequest {
  peerId: string;
  apiBaseUrl?: string;
  labels?: Record<string, string>;
  advertisedBrickIds?: string[];
  drained?: boolean;
  name?: string;
  maxConcurrency?: number;
  cpuCount?: number;
  memoryMb?: number;
}

function nodeBody(r: NodeRequest): NodeRequest {
  return {
    apiBaseUrl: `https://${r.peerId}.tailnet:8080/`,
    labels: {},
    advertisedBrickIds: [],
    drained: false,
    ...r,
  };
}

async function registerNode(r: NodeRequest, token: string = server.adminToken): Promise<FleetNode> {
  return expectOk(await mesh<FleetNode>("POST", "/fleet/nodes", { token, json: nodeBody(r) }));
}

interface TaskRequest {
  name?: string;
  steps?: number;
  requiredBrickIds?: string[];
  affinity?: Record<string, string>;
  priority?: number;
  deadlineUtc?: string | null;
  idempotencyKey?: string | null;
  correlationId?: string | null;
  workload?: string;
  parameters?: Body;
  maxAttempts?: number;
  leaseSeconds?: number;
}

function taskBody(r: TaskRequest): TaskRequest {
  return {
    name: `task-${uid()}`,
    steps: 1,
    requiredBrickIds: [],
    affinity: {},
    priority: 0,
    deadlineUtc: null,
    idempotencyKey: null,
    correlationId: null,
    ...r,
  };
}

async function createTask(r: TaskRequest, token: string = clientToken): Promise<MeshTask> {
  const task = expectOk(await mesh<MeshTask>("POST", "/tasks", { token, json: taskBody(r) }));
  expect(task.status).toBe("Pending");
  return task;
}

async function getTask(taskId: string, token: string = clientToken): Promise<MeshTask> {
  return expectOk(await mesh<MeshTask>("GET", `/tasks/${taskId}`, { token }));
}

async function schedule(
  taskId: string,
  json: Body = {},
  token: string = clientToken,
): Promise<MeshTask> {
  const task = expectOk(await mesh<MeshTask>("POST", `/tasks/${taskId}/schedule`, { token, json }));
  expect(task.status).toBe("Assigned");
  return task;
}

function patchStatus(taskId: string, json: Body, token: string = server.adminToken) {
  return mesh<MeshTask>("PATCH", `/tasks/${taskId}/status`, { token, json });
}

async function listNodes(token: string = clientToken): Promise<FleetNode[]> {
  return expectOk(await mesh<FleetNode[]>("GET", "/fleet/nodes", { token }));
}

async function upload(
  taskId: string,
  workerId: string,
  attempt: number,
  bytes: string,
  token: string = server.adminToken,
  filename = "out.bin",
): Promise<Answer<Uploaded>> {
  return call<Uploaded>("PUT", `/tasks/${taskId}/artifacts/${filename}`, {
    token,
    raw: bytes,
    headers: {
      "content-type": "application/octet-stream",
      "x-worker-id": workerId,
      "x-task-attempt": String(attempt),
    },
  });
}

async function resultBytes(taskId: string, token: string = clientToken) {
  const res = await fetch(`${server.url}/api/mesh/tasks/${taskId}/result`, {
    headers: { authorization: `Bearer ${token}` },
    redirect: "manual",
    signal: AbortSignal.timeout(REQUEST_BOUND_MS),
  });
  return { status: res.status, bytes: Buffer.from(await res.arrayBuffer()) };
}

/** A node (admin-registered, unless a token is given) advertising a brick only this test uses. */
async function nodeWithBrick(extra: Partial<NodeRequest> = {}, token?: string) {
  const brick = `brick-${uid()}`;
  const node = await registerNode(
    { peerId: `peer-${uid()}`, advertisedBrickIds: [brick], ...extra },
    token,
  );
  return { brick, node };
}

/** A task scheduled on a fresh node of its own, answered with the lease token. */
async function assignedTask(extra: Partial<NodeRequest> = {}, nodeToken?: string) {
  const { brick, node } = await nodeWithBrick(extra, nodeToken);
  const created = await createTask({ requiredBrickIds: [brick] });
  const task = await schedule(created.taskId);
  expect(task.assignedPeerId).toBe(node.peerId);
  expect(typeof task.leaseToken).toBe("string");
  return { brick, node, task, token: task.leaseToken as string };
}

/** Seconds from now to an RFC 3339 time. */
const secondsAhead = (utc: string | null) => (Date.parse(utc ?? "") - Date.now()) / 1000;

describe("director REST contract: fleet nodes", () => {
  it("POST /fleet/nodes registers a node by peerId; GET /fleet/nodes lists it with every documented field", async () => {
    const peerId = `worker-${uid()}`;
    const node = await registerNode({
      peerId,
      apiBaseUrl: `https://${peerId}.tailnet:8080/`,
      labels: { region: "us-west" },
      advertisedBrickIds: ["my-custom-brick"],
      drained: false,
    });
    for (const field of NODE_FIELDS) expect(node, field).toHaveProperty(field);
    expect(node).toMatchObject({
      peerId,
      name: peerId,
      apiBaseUrl: `https://${peerId}.tailnet:8080/`,
      labels: { region: "us-west" },
      advertisedBrickIds: ["my-custom-brick"],
      drained: false,
      state: "Active",
      queueDepth: 0,
      activeLeases: 0,
      // No maxConcurrency stated: no slot limit (placed greedily, as the contract places).
      maxConcurrency: null,
    });
    expect(node.workerId).toMatch(UUID);
    expect(node.registeredUtc).toMatch(MILLIS_UTC);
    expect(node.lastHeartbeatUtc).toMatch(MILLIS_UTC);

    const listed = await listNodes();
    expect(Array.isArray(listed)).toBe(true);
    const mine = listed.filter((n) => n.peerId === peerId);
    expect(mine).toHaveLength(1);
    expect(mine[0]).toMatchObject({ peerId, workerId: node.workerId, name: peerId });

    // Oldest first: a node registered later comes after it.
    const later = await registerNode({ peerId: `worker-${uid()}` });
    const order = (await listNodes()).map((n) => n.peerId);
    expect(order.indexOf(peerId)).toBeLessThan(order.indexOf(later.peerId));

    // The optional fields are taken as given.
    const full = await registerNode({
      peerId: `worker-${uid()}`,
      name: "render-box",
      maxConcurrency: 4,
      cpuCount: 8,
      memoryMb: 16384,
    });
    expect(full).toMatchObject({
      name: "render-box",
      maxConcurrency: 4,
      cpuCount: 8,
      memoryMb: 16384,
    });
  });

  it("a second POST with the same peerId updates the same node (same workerId, new labels and apiBaseUrl), listed once", async () => {
    const peerId = `worker-${uid()}`;
    const first = await registerNode({
      peerId,
      apiBaseUrl: "https://old.example:8080/",
      labels: { region: "us-west" },
      advertisedBrickIds: ["a"],
    });
    const second = await registerNode({
      peerId,
      apiBaseUrl: "https://new.example:9090/",
      labels: { region: "eu-central", gpu: "a100" },
      advertisedBrickIds: ["b", "c"],
    });
    expect(second.workerId).toBe(first.workerId);
    expect(second).toMatchObject({
      peerId,
      apiBaseUrl: "https://new.example:9090/",
      labels: { region: "eu-central", gpu: "a100" },
      advertisedBrickIds: ["b", "c"],
    });
    const mine = (await listNodes()).filter((n) => n.peerId === peerId);
    expect(mine).toHaveLength(1);
    expect(mine[0]).toMatchObject({
      workerId: first.workerId,
      apiBaseUrl: "https://new.example:9090/",
      labels: { region: "eu-central", gpu: "a100" },
      advertisedBrickIds: ["b", "c"],
    });
  });

  it("POST /fleet/nodes without a peerId, or with a malformed one, is 400 and registers nothing", async () => {
    const before = (await listNodes()).length;
    const missing = await mesh("POST", "/fleet/nodes", {
      json: {
        apiBaseUrl: "https://x.example/",
        labels: {},
        advertisedBrickIds: [],
        drained: false,
      },
    });
    expectRefusal(missing, 400, "invalid_argument");
    const spaced = await mesh("POST", "/fleet/nodes", {
      json: nodeBody({ peerId: `bad peer ${uid()}` }),
    });
    expectRefusal(spaced, 400, "invalid_argument");
    const tooLong = await mesh("POST", "/fleet/nodes", {
      json: nodeBody({ peerId: "p".repeat(257) }),
    });
    expectRefusal(tooLong, 400, "invalid_argument");
    expect((await listNodes()).length).toBe(before);
  });

  it("POST /fleet/nodes/{peerId}/heartbeat with queueDepth answers {peerId, drained, heartbeatIntervalSeconds}; the depth shows in the node list and /elastic/status", async () => {
    const { node } = await nodeWithBrick();
    const beat = expectOk(
      await mesh("POST", `/fleet/nodes/${node.peerId}/heartbeat`, { json: { queueDepth: 7 } }),
    );
    expect(beat).toMatchObject({ peerId: node.peerId, drained: false });
    expect(typeof beat.heartbeatIntervalSeconds).toBe("number");
    expect(beat.heartbeatIntervalSeconds as number).toBeGreaterThan(0);

    const listed = (await listNodes()).find((n) => n.peerId === node.peerId);
    expect(listed?.queueDepth).toBe(7);
    expect(listed?.state).toBe("Active");

    const status = expectOk(
      await mesh<{ workers: Body[] }>("GET", "/elastic/status", { token: clientToken }),
    );
    const worker = status.workers.find((w) => w.peerId === node.peerId);
    expect(worker).toMatchObject({ peerId: node.peerId, workerId: node.workerId, queueDepth: 7 });

    // The body is optional.
    const bare = await mesh("POST", `/fleet/nodes/${node.peerId}/heartbeat`);
    expect(bare.status, bare.text).toBe(200);
    expect(bare.body).toMatchObject({ peerId: node.peerId, drained: false });

    const unknown = await mesh("POST", `/fleet/nodes/nobody-${uid()}/heartbeat`, {
      json: { queueDepth: 1 },
    });
    expectRefusal(unknown, 404, "not_found");
  });

  it("POST /fleet/nodes/{peerId}/drain: a drained node gets no placement (400 failed_precondition) until it is undrained", async () => {
    const { brick, node } = await nodeWithBrick({ maxConcurrency: 4 });
    const drained = expectOk(
      await mesh<FleetNode>("POST", `/fleet/nodes/${node.peerId}/drain`, {
        json: { drained: true },
      }),
    );
    expect(drained).toMatchObject({ peerId: node.peerId, workerId: node.workerId, drained: true });
    expect((await listNodes()).find((n) => n.peerId === node.peerId)?.drained).toBe(true);
    const beat = await mesh("POST", `/fleet/nodes/${node.peerId}/heartbeat`, { json: {} });
    expect(beat.body).toMatchObject({ drained: true });

    const task = await createTask({ requiredBrickIds: [brick] });
    const refused = await mesh("POST", `/tasks/${task.taskId}/schedule`, {
      token: clientToken,
      json: {},
    });
    expectRefusal(refused, 400, "failed_precondition", "NO_CANDIDATE");
    expect(String((refused.body as Body).message ?? "").length).toBeGreaterThan(0);
    expect(await getTask(task.taskId)).toMatchObject({ status: "Pending", attempt: 0 });

    const undrained = expectOk(
      await mesh<FleetNode>("POST", `/fleet/nodes/${node.peerId}/drain`, {
        json: { drained: false },
      }),
    );
    expect(undrained.drained).toBe(false);
    const placed = await schedule(task.taskId);
    expect(placed.assignedPeerId).toBe(node.peerId);

    // Without a body, drain means drained: true.
    const again = expectOk(await mesh<FleetNode>("POST", `/fleet/nodes/${node.peerId}/drain`));
    expect(again.drained).toBe(true);

    // Registering with drained: true drains too.
    const { brick: brick2, node: node2 } = await nodeWithBrick({ drained: true });
    expect(node2.drained).toBe(true);
    const task2 = await createTask({ requiredBrickIds: [brick2] });
    const refused2 = await mesh("POST", `/tasks/${task2.taskId}/schedule`, { token: clientToken });
    expectRefusal(refused2, 400, "failed_precondition");

    const unknown = await mesh("POST", `/fleet/nodes/nobody-${uid()}/drain`, {
      json: { drained: true },
    });
    expectRefusal(unknown, 404, "not_found");
  });

  it("DELETE /fleet/nodes/{peerId} removes the node and releases its leases (tasks back to Pending)", async () => {
    const { task, node } = await assignedTask();
    const removed = expectOk(await mesh("DELETE", `/fleet/nodes/${node.peerId}`));
    expect(removed).toEqual({ peerId: node.peerId, releasedTaskIds: [task.taskId] });
    expect((await listNodes()).some((n) => n.peerId === node.peerId)).toBe(false);
    const after = await getTask(task.taskId);
    expect(after).toMatchObject({
      status: "Pending",
      leaseOwnerPeerId: null,
      leaseExpiresUtc: null,
    });

    // Gone: every route naming it is 404.
    expectRefusal(await mesh("DELETE", `/fleet/nodes/${node.peerId}`), 404, "not_found");
    expectRefusal(
      await mesh("POST", `/fleet/nodes/${node.peerId}/heartbeat`, { json: {} }),
      404,
      "not_found",
    );

    // A node without leases releases nothing.
    const { node: idle } = await nodeWithBrick();
    expect(expectOk(await mesh("DELETE", `/fleet/nodes/${idle.peerId}`))).toEqual({
      peerId: idle.peerId,
      releasedTaskIds: [],
    });
  });

  it("GET /elastic/status reports taskCounts for every status, the backlog by workload and every worker", async () => {
    const { brick, node } = await nodeWithBrick({ maxConcurrency: 3 });
    const first = await createTask({ requiredBrickIds: [brick] });
    await createTask({ requiredBrickIds: [brick] });
    const status = expectOk(
      await mesh<{ taskCounts: Record<string, number>; backlog: Body[]; workers: Body[] }>(
        "GET",
        "/elastic/status",
        { token: clientToken },
      ),
    );
    for (const s of ["Pending", "Assigned", "Running", "Succeeded", "Failed", "Canceled"]) {
      expect(typeof status.taskCounts[s], s).toBe("number");
    }
    expect(status.taskCounts.Pending).toBeGreaterThanOrEqual(2);
    const backlog = status.backlog.find((b) => b.workload === brick);
    expect(backlog).toMatchObject({ workload: brick, pendingCount: 2 });
    expect(backlog?.oldestCreatedUtc).toBe(first.createdUtc);
    expect(typeof backlog?.oldestAgeSeconds).toBe("number");
    const worker = status.workers.find((w) => w.peerId === node.peerId);
    for (const field of [
      "peerId",
      "workerId",
      "name",
      "state",
      "drained",
      "queueDepth",
      "activeLeases",
      "maxConcurrency",
      "freeSlots",
    ]) {
      expect(worker, field).toHaveProperty(field);
    }
    expect(worker).toMatchObject({
      workerId: node.workerId,
      name: node.peerId,
      state: "Active",
      drained: false,
      activeLeases: 0,
      maxConcurrency: 3,
      freeSlots: 3,
    });

    await schedule(first.taskId);
    const after = expectOk(
      await mesh<{ taskCounts: Record<string, number>; backlog: Body[]; workers: Body[] }>(
        "GET",
        "/elastic/status",
        { token: clientToken },
      ),
    );
    expect(after.taskCounts.Assigned).toBe((status.taskCounts.Assigned ?? 0) + 1);
    expect(after.taskCounts.Pending).toBe((status.taskCounts.Pending ?? 0) - 1);
    expect(after.backlog.find((b) => b.workload === brick)).toMatchObject({ pendingCount: 1 });
    expect(after.workers.find((w) => w.peerId === node.peerId)).toMatchObject({
      activeLeases: 1,
      freeSlots: 2,
    });
  });
});

describe("director REST contract: tasks", () => {
  it("POST /tasks creates a Pending task with every documented field; GET /tasks/{id} reads it back", async () => {
    const brick = `brick-${uid()}`;
    const name = `batch-step-${uid()}`;
    const created = await createTask({
      name,
      steps: 3,
      requiredBrickIds: [brick, "other-brick"],
      affinity: { region: "us-west" },
      priority: 5,
      deadlineUtc: "2099-01-01T00:00:00.000Z",
      parameters: { queryId: "CHEMBL939", topK: 20 },
      maxAttempts: 4,
    });
    for (const field of TASK_FIELDS) expect(created, field).toHaveProperty(field);
    expect(created).toMatchObject({
      name,
      status: "Pending",
      workload: brick, // defaults to the first of requiredBrickIds
      steps: 3,
      requiredBrickIds: [brick, "other-brick"],
      affinity: { region: "us-west" },
      priority: 5,
      parameters: { queryId: "CHEMBL939", topK: 20 },
      maxAttempts: 4,
      attempt: 0,
      leaseToken: null,
      leaseOwnerPeerId: null,
      leaseExpiresUtc: null,
      assignedPeerId: null,
      assignedApiBaseUrl: null,
      resultHandle: null,
      result: null,
      cancelRequested: false,
      startedUtc: null,
      finishedUtc: null,
    });
    expect(created.taskId).toMatch(UUID);
    expect(Date.parse(created.deadlineUtc ?? "")).toBe(Date.parse("2099-01-01T00:00:00.000Z"));
    expect(created.createdUtc).toMatch(MILLIS_UTC);
    expect(created.updatedUtc).toMatch(MILLIS_UTC);

    // The read is the task as created, and why it waits (no worker runs
    // its brick) with its place in its share.
    const { waiting, queuePosition, ...read } = (await getTask(
      created.taskId,
    )) as typeof created & {
      waiting: { kind: string; message: string }[];
      queuePosition: number;
    };
    expect(read).toEqual(created);
    expect(waiting.map((w) => w.kind)).toEqual(["NO_MATCHING_WORKER"]);
    expect(queuePosition).toBeGreaterThanOrEqual(1);

    // An explicit workload is kept.
    const explicit = await createTask({ workload: `wl-${uid()}`, requiredBrickIds: [brick] });
    expect(explicit.workload).not.toBe(brick);
    expect(explicit.requiredBrickIds).toEqual([brick]);
  });

  it("GET /tasks filters by status, workload and correlationId, lists newest first, and pages with pageSize and nextPageToken", async () => {
    const { brick } = await nodeWithBrick({ maxConcurrency: 4 });
    const correlation = `corr-${uid()}`;
    const a = await createTask({ requiredBrickIds: [brick], correlationId: correlation });
    const b = await createTask({ requiredBrickIds: [brick] });
    const c = await createTask({ requiredBrickIds: [brick], correlationId: correlation });
    await schedule(b.taskId);

    type Page = { tasks: MeshTask[]; nextPageToken: string | null };
    const all = expectOk(
      await mesh<Page>("GET", `/tasks?workload=${brick}`, { token: clientToken }),
    );
    expect(all.tasks.map((t) => t.taskId)).toEqual([c.taskId, b.taskId, a.taskId]);
    expect(all.nextPageToken).toBeNull();
    for (const t of all.tasks) expect(t.leaseToken).toBeNull();

    const pending = expectOk(
      await mesh<Page>("GET", `/tasks?workload=${brick}&status=Pending`, { token: clientToken }),
    );
    expect(pending.tasks.map((t) => t.taskId)).toEqual([c.taskId, a.taskId]);
    const assigned = expectOk(
      await mesh<Page>("GET", `/tasks?workload=${brick}&status=Assigned`, { token: clientToken }),
    );
    expect(assigned.tasks.map((t) => t.taskId)).toEqual([b.taskId]);

    const byCorrelation = expectOk(
      await mesh<Page>("GET", `/tasks?correlationId=${correlation}`, { token: clientToken }),
    );
    expect(byCorrelation.tasks.map((t) => t.taskId)).toEqual([c.taskId, a.taskId]);

    const seen: string[] = [];
    let token: string | null = null;
    for (let page = 0; page < 5; page++) {
      const query: string =
        `/tasks?workload=${brick}&pageSize=1` +
        (token === null ? "" : `&pageToken=${encodeURIComponent(token)}`);
      const got: Page = expectOk(await mesh<Page>("GET", query, { token: clientToken }));
      expect(got.tasks.length).toBeLessThanOrEqual(1);
      seen.push(...got.tasks.map((t) => t.taskId));
      token = got.nextPageToken;
      if (token === null) break;
      expect(typeof token).toBe("string");
    }
    expect(seen).toEqual([c.taskId, b.taskId, a.taskId]);
    expect(token).toBeNull();

    expectRefusal(
      await mesh("GET", `/tasks?workload=${brick}&pageSize=1001`, { token: clientToken }),
      400,
      "invalid_argument",
    );
    expectRefusal(
      await mesh("GET", "/tasks?status=Sleeping", { token: clientToken }),
      400,
      "invalid_argument",
    );
    // pageSize is 1–1000: 0 is out of range too.
    expectRefusal(
      await mesh("GET", `/tasks?workload=${brick}&pageSize=0`, { token: clientToken }),
      400,
      "invalid_argument",
    );
  });

  it("POST /tasks with an idempotencyKey: the same body again is 200 with the same taskId; the same key with other content is 409 already_exists", async () => {
    const brick = `brick-${uid()}`;
    const key = `create-${uid()}`;
    const body = taskBody({
      name: `idem-${uid()}`,
      requiredBrickIds: [brick],
      idempotencyKey: key,
    });
    const first = await mesh<MeshTask>("POST", "/tasks", { token: clientToken, json: body });
    expect(first.status, first.text).toBe(200);
    expect(first.body).toMatchObject({ status: "Pending", idempotencyKey: key });

    const again = await mesh<MeshTask>("POST", "/tasks", { token: clientToken, json: body });
    expect(again.status, again.text).toBe(200);
    expect(again.body.taskId).toBe(first.body.taskId);

    // Another correlation id is tracing metadata, not other content.
    const traced = await mesh<MeshTask>("POST", "/tasks", {
      token: clientToken,
      json: body,
      headers: { "X-Ashlar-Correlation-Id": `retry-${uid()}` },
    });
    expect(traced.status, traced.text).toBe(200);
    expect(traced.body.taskId).toBe(first.body.taskId);

    const conflict = await mesh("POST", "/tasks", {
      token: clientToken,
      json: { ...body, priority: 9 },
    });
    expectRefusal(conflict, 409, "already_exists", "IDEMPOTENCY_KEY_REUSED");

    // The first task stands, and it is the only one.
    expect(await getTask(first.body.taskId)).toMatchObject({ priority: 0, status: "Pending" });
    const listed = expectOk(
      await mesh<{ tasks: MeshTask[] }>("GET", `/tasks?workload=${brick}`, { token: clientToken }),
    );
    expect(listed.tasks.map((t) => t.taskId)).toEqual([first.body.taskId]);
  });

  it("schedule with scheduleIdempotencyKey: Assigned with the placement and lease fields; the same key again gives the same assignment; another key (or none) is 409 with the current task as body", async () => {
    const { brick, node } = await nodeWithBrick({ maxConcurrency: 4 });
    const { node: other } = await nodeWithBrick({ advertisedBrickIds: [brick], maxConcurrency: 4 });
    const task = await createTask({ requiredBrickIds: [brick] });
    const k1 = `sched-${uid()}`;

    const first = await mesh<MeshTask>("POST", `/tasks/${task.taskId}/schedule`, {
      token: clientToken,
      json: { scheduleIdempotencyKey: k1 },
    });
    expect(first.status, first.text).toBe(200);
    const placed = first.body;
    expect(placed.status).toBe("Assigned");
    expect([node.peerId, other.peerId]).toContain(placed.assignedPeerId);
    const holder = placed.assignedPeerId === node.peerId ? node : other;
    expect(placed).toMatchObject({
      taskId: task.taskId,
      attempt: 1,
      assignedPeerId: holder.peerId,
      assignedApiBaseUrl: holder.apiBaseUrl,
      leaseOwnerPeerId: holder.peerId,
      leaseSeconds: 600,
    });
    expect(placed.leaseToken).toMatch(/^[0-9a-f]{64}$/);
    expect(placed.leaseExpiresUtc).toMatch(MILLIS_UTC);
    const ahead = secondsAhead(placed.leaseExpiresUtc);
    expect(ahead).toBeGreaterThan(600 - 120);
    expect(ahead).toBeLessThan(600 + 120);

    const repeat = await mesh<MeshTask>("POST", `/tasks/${task.taskId}/schedule`, {
      token: clientToken,
      json: { scheduleIdempotencyKey: k1 },
    });
    expect(repeat.status, repeat.text).toBe(200);
    expect(repeat.body).toMatchObject({
      taskId: task.taskId,
      status: "Assigned",
      attempt: 1,
      assignedPeerId: placed.assignedPeerId,
      assignedApiBaseUrl: placed.assignedApiBaseUrl,
      leaseOwnerPeerId: placed.leaseOwnerPeerId,
      leaseExpiresUtc: placed.leaseExpiresUtc,
    });
    // protocol.md#push-placement: "returns the same assignment (token included)".
    expect(repeat.body.leaseToken).toBe(placed.leaseToken);

    const conflict = await mesh<MeshTask & ErrorBody>("POST", `/tasks/${task.taskId}/schedule`, {
      token: clientToken,
      json: { scheduleIdempotencyKey: `sched-${uid()}` },
    });
    expectRefusal(conflict, 409, "aborted", "ALREADY_ASSIGNED");
    expect(conflict.body).toMatchObject({
      taskId: task.taskId,
      status: "Assigned",
      attempt: 1,
      assignedPeerId: placed.assignedPeerId,
    });

    const keyless = await mesh<MeshTask & ErrorBody>("POST", `/tasks/${task.taskId}/schedule`, {
      token: clientToken,
    });
    expectRefusal(keyless, 409, "aborted", "ALREADY_ASSIGNED");
    expect(keyless.body).toMatchObject({ taskId: task.taskId, status: "Assigned" });

    // No new placement happened: the task is as the first answer left it.
    expect(await getTask(task.taskId)).toMatchObject({
      status: "Assigned",
      attempt: 1,
      assignedPeerId: placed.assignedPeerId,
      leaseExpiresUtc: placed.leaseExpiresUtc,
      leaseToken: null,
    });
  });

  it("schedule takes leaseSeconds (60–86400) and refuses a value out of range", async () => {
    const { brick } = await nodeWithBrick({ maxConcurrency: 4 });
    const task = await createTask({ requiredBrickIds: [brick] });
    for (const leaseSeconds of [59, 86401]) {
      const refused = await mesh("POST", `/tasks/${task.taskId}/schedule`, {
        token: clientToken,
        json: { leaseSeconds },
      });
      expectRefusal(refused, 400, "invalid_argument");
    }
    expect(await getTask(task.taskId)).toMatchObject({ status: "Pending", attempt: 0 });
    const placed = await schedule(task.taskId, { leaseSeconds: 120 });
    expect(placed.leaseSeconds).toBe(120);
    const ahead = secondsAhead(placed.leaseExpiresUtc);
    expect(ahead).toBeGreaterThan(0);
    expect(ahead).toBeLessThan(120 + 60);
  });

  it("retry places an Assigned task on another node when one fits, under a new attempt and token; the old token is refused", async () => {
    const brick = `brick-${uid()}`;
    const a = await registerNode({ peerId: `peer-${uid()}`, advertisedBrickIds: [brick] });
    const b = await registerNode({ peerId: `peer-${uid()}`, advertisedBrickIds: [brick] });
    const task = await createTask({ requiredBrickIds: [brick] });
    const first = await schedule(task.taskId);
    expect([a.peerId, b.peerId]).toContain(first.assignedPeerId);
    const otherNode = first.assignedPeerId === a.peerId ? b : a;

    const retried = await mesh<MeshTask>("POST", `/tasks/${task.taskId}/retry`, {
      token: clientToken,
      json: { scheduleIdempotencyKey: `retry-${uid()}` },
    });
    expect(retried.status, retried.text).toBe(200);
    expect(retried.body).toMatchObject({
      taskId: task.taskId,
      status: "Assigned",
      attempt: 2,
      assignedPeerId: otherNode.peerId,
      assignedApiBaseUrl: otherNode.apiBaseUrl,
      leaseOwnerPeerId: otherNode.peerId,
    });
    expect(retried.body.leaseToken).toMatch(/^[0-9a-f]{64}$/);
    expect(retried.body.leaseToken).not.toBe(first.leaseToken);

    const stale = await patchStatus(task.taskId, {
      status: "Running",
      leaseToken: first.leaseToken,
    });
    expectRefusal(stale, 409, "aborted");
    expect(await getTask(task.taskId)).toMatchObject({ status: "Assigned", attempt: 2 });

    // A Pending task is not retried: schedule it instead.
    const pending = await createTask({ requiredBrickIds: [brick] });
    expectRefusal(
      await mesh("POST", `/tasks/${pending.taskId}/retry`, { token: clientToken }),
      400,
      "failed_precondition",
      "INVALID_STATE",
    );
  });

  it("GET /tasks/{id}/result is 404 before the task has a result", async () => {
    const task = await createTask({ requiredBrickIds: [`brick-${uid()}`] });
    const got = await resultBytes(task.taskId);
    expect(got.status).toBe(404);
    const unknown = await resultBytes(randomUUID());
    expect(unknown.status).toBe(404);
  });
});

describe("director REST contract: scheduling fields", () => {
  it("takes resources, requirements, preferences, share and keys on a task and capacity on a node, and places by them", async () => {
    const brick = `sched-${uid()}`;
    const small = await registerNode({
      peerId: `small-${uid()}`,
      advertisedBrickIds: [brick],
      labels: { model: "t4" },
      maxConcurrency: 4,
      ...({ capacity: { gpu: 1 } } as object),
    });
    expect(small).toMatchObject({ capacity: { gpu: 1, slots: 4 }, allocated: {} });
    const big = await registerNode({
      peerId: `big-${uid()}`,
      advertisedBrickIds: [brick],
      labels: { model: "a100" },
      maxConcurrency: 4,
      ...({ capacity: { gpu: 4 } } as object),
    });
    const task = await createTask({
      requiredBrickIds: [brick],
      ...({
        resources: { gpu: 2 },
        requirements: [{ key: "model", operator: "In", values: ["a100", "h100"] }],
        preferences: [{ weight: 10, requirement: { key: "model", operator: "Exists" } }],
        share: "lab/render",
        concurrencyKey: "licence",
        rateKey: "api",
      } as object),
    });
    expect(task).toMatchObject({
      resources: { gpu: 2, slots: 1 },
      requirements: [{ key: "model", operator: "In", values: ["a100", "h100"] }],
      preferences: [{ weight: 10, requirement: { key: "model", operator: "Exists", values: [] } }],
      share: "lab/render",
      concurrencyKey: "licence",
      rateKey: "api",
    });
    const placed = await schedule(task.taskId);
    expect(placed.assignedPeerId).toBe(big.peerId);
    const nodes = await listNodes();
    expect(nodes.find((n) => n.peerId === big.peerId)).toMatchObject({
      allocated: { gpu: 2, slots: 1 },
    });
    expect(nodes.find((n) => n.peerId === small.peerId)).toMatchObject({ allocated: {} });
    // A bad operator is a 400, naming the field.
    const bad = await mesh("POST", "/tasks", {
      token: clientToken,
      json: taskBody({
        requiredBrickIds: [brick],
        ...({ requirements: [{ key: "model", operator: "Near", values: [] }] } as object),
      }),
    });
    expectRefusal(bad, 400, "invalid_argument");
    expect((bad.body as Body).message).toContain("requirements[0].operator");
  });
});

describe("director REST contract: placement rules", () => {
  it("places any number of tasks on a node that states no maxConcurrency, greedily; a stated one still bounds", async () => {
    const { brick, node } = await nodeWithBrick();
    for (let i = 0; i < 5; i++) {
      const task = await createTask({ requiredBrickIds: [brick] });
      expect((await schedule(task.taskId)).assignedPeerId).toBe(node.peerId);
    }
    const got = expectOk(
      await mesh<FleetNode>("GET", `/fleet/nodes/${node.peerId}`, { token: clientToken }),
    );
    expect(got).toMatchObject({ peerId: node.peerId, activeLeases: 5, maxConcurrency: null });

    const bounded = await nodeWithBrick({ maxConcurrency: 1 });
    await schedule((await createTask({ requiredBrickIds: [bounded.brick] })).taskId);
    const second = await createTask({ requiredBrickIds: [bounded.brick] });
    const refused = await mesh("POST", `/tasks/${second.taskId}/schedule`, { token: clientToken });
    expectRefusal(refused, 400, "failed_precondition", "NO_CANDIDATE");
  });

  it("GET /fleet/nodes/{peerId} reads one node; an unknown peer is 404", async () => {
    const { node } = await nodeWithBrick({ maxConcurrency: 3, name: "one" });
    const got = expectOk(
      await mesh<FleetNode>("GET", `/fleet/nodes/${node.peerId}`, { token: clientToken }),
    );
    expect(got).toEqual({ ...node, lastHeartbeatUtc: got.lastHeartbeatUtc });
    const missing = await mesh("GET", `/fleet/nodes/peer-${uid()}`, { token: clientToken });
    expectRefusal(missing, 404, "not_found", "NOT_FOUND");
  });

  it("every affinity entry must equal a node label", async () => {
    const brick = `brick-${uid()}`;
    const region = `region-${uid()}`;
    const node = await registerNode({
      peerId: `peer-${uid()}`,
      advertisedBrickIds: [brick],
      labels: { region, tier: "gold" },
      maxConcurrency: 4,
    });

    const wrongValue = await createTask({
      requiredBrickIds: [brick],
      affinity: { region: "elsewhere" },
    });
    const refused = await mesh("POST", `/tasks/${wrongValue.taskId}/schedule`, {
      token: clientToken,
    });
    expectRefusal(refused, 400, "failed_precondition", "NO_CANDIDATE");
    expect(String((refused.body as Body).message ?? "").length).toBeGreaterThan(0);

    const missingLabel = await createTask({
      requiredBrickIds: [brick],
      affinity: { region, zone: "a" },
    });
    expectRefusal(
      await mesh("POST", `/tasks/${missingLabel.taskId}/schedule`, { token: clientToken }),
      400,
      "failed_precondition",
      "NO_CANDIDATE",
    );

    const matching = await createTask({
      requiredBrickIds: [brick],
      affinity: { region, tier: "gold" },
    });
    expect((await schedule(matching.taskId)).assignedPeerId).toBe(node.peerId);
    const subset = await createTask({ requiredBrickIds: [brick], affinity: { region } });
    expect((await schedule(subset.taskId)).assignedPeerId).toBe(node.peerId);

    for (const t of [wrongValue, missingLabel]) {
      expect(await getTask(t.taskId)).toMatchObject({ status: "Pending", attempt: 0 });
    }
  });

  it("every required brick must be advertised; a label value brick:<id> also counts", async () => {
    const b1 = `brick-${uid()}`;
    const b2 = `brick-${uid()}`;
    await registerNode({ peerId: `peer-${uid()}`, advertisedBrickIds: [b1], maxConcurrency: 4 });

    const both = await createTask({ requiredBrickIds: [b1, b2] });
    const refused = await mesh("POST", `/tasks/${both.taskId}/schedule`, { token: clientToken });
    expectRefusal(refused, 400, "failed_precondition", "NO_CANDIDATE");
    expect(String((refused.body as Body).message ?? "").length).toBeGreaterThan(0);
    expect(await getTask(both.taskId)).toMatchObject({ status: "Pending", attempt: 0 });

    const labelled = await registerNode({
      peerId: `peer-${uid()}`,
      advertisedBrickIds: [b1],
      labels: { extra: `brick:${b2}` },
      maxConcurrency: 4,
    });
    expect((await schedule(both.taskId)).assignedPeerId).toBe(labelled.peerId);

    // A brick named only by a label is enough on its own, too.
    const b3 = `brick-${uid()}`;
    const onlyLabel = await registerNode({
      peerId: `peer-${uid()}`,
      labels: { role: `brick:${b3}` },
    });
    const t3 = await createTask({ requiredBrickIds: [b3] });
    expect((await schedule(t3.taskId)).assignedPeerId).toBe(onlyLabel.peerId);
  });

  it("no candidate at all is 400 failed_precondition with a message, and the task stays Pending", async () => {
    const task = await createTask({ requiredBrickIds: [`nobody-has-${uid()}`] });
    const refused = await mesh("POST", `/tasks/${task.taskId}/schedule`, {
      token: clientToken,
      json: { scheduleIdempotencyKey: `k-${uid()}` },
    });
    expectRefusal(refused, 400, "failed_precondition", "NO_CANDIDATE");
    expect(String((refused.body as Body).message ?? "").length).toBeGreaterThan(0);
    expect(await getTask(task.taskId)).toMatchObject({
      status: "Pending",
      attempt: 0,
      assignedPeerId: null,
    });

    // A node without an apiBaseUrl is no candidate either.
    const brick = `brick-${uid()}`;
    const noUrl = await mesh("POST", "/fleet/nodes", {
      json: {
        ...nodeBody({ peerId: `peer-${uid()}`, advertisedBrickIds: [brick] }),
        apiBaseUrl: "",
      },
    });
    expect(noUrl.status, noUrl.text).toBe(200);
    const t2 = await createTask({ requiredBrickIds: [brick] });
    expectRefusal(
      await mesh("POST", `/tasks/${t2.taskId}/schedule`, { token: clientToken }),
      400,
      "failed_precondition",
      "NO_CANDIDATE",
    );
  });
});

describe("director REST contract: correlation", () => {
  it("a request without a correlation id gets one generated and echoed; POST /tasks stores it", async () => {
    const listed = await mesh("GET", "/fleet/nodes", { token: clientToken });
    const generated = listed.headers.get("x-ashlar-correlation-id");
    expect(generated, "X-Ashlar-Correlation-Id on the answer").toBeTruthy();

    const created = await mesh<MeshTask>("POST", "/tasks", {
      token: clientToken,
      json: taskBody({ requiredBrickIds: [`brick-${uid()}`] }),
    });
    expect(created.status, created.text).toBe(200);
    const echoed = created.headers.get("x-ashlar-correlation-id");
    expect(echoed).toBeTruthy();
    expect(echoed).not.toBe(generated);
    expect(created.body.correlationId).toBe(echoed);

    // Errors carry it too.
    const missing = await mesh("GET", `/tasks/${randomUUID()}`, { token: clientToken });
    expect(missing.status).toBe(404);
    expect(missing.headers.get("x-ashlar-correlation-id")).toBeTruthy();
  });

  it("an X-Ashlar-Correlation-Id sent is echoed and stored on the task when the body has none; x-correlation-id works too", async () => {
    const sent = `corr-${uid()}`;
    const created = await mesh<MeshTask>("POST", "/tasks", {
      token: clientToken,
      json: taskBody({ requiredBrickIds: [`brick-${uid()}`] }),
      headers: { "X-Ashlar-Correlation-Id": sent },
    });
    expect(created.status, created.text).toBe(200);
    expect(created.headers.get("x-ashlar-correlation-id")).toBe(sent);
    expect(created.body.correlationId).toBe(sent);
    expect((await getTask(created.body.taskId)).correlationId).toBe(sent);

    const plain = `corr-${uid()}`;
    const viaPlain = await mesh<MeshTask>("POST", "/tasks", {
      token: clientToken,
      json: taskBody({ requiredBrickIds: [`brick-${uid()}`] }),
      headers: { "x-correlation-id": plain },
    });
    expect(viaPlain.status, viaPlain.text).toBe(200);
    expect(viaPlain.headers.get("x-correlation-id")).toBe(plain);
    expect(viaPlain.headers.get("x-ashlar-correlation-id")).toBe(plain);
    expect(viaPlain.body.correlationId).toBe(plain);

    const read = await mesh("GET", "/elastic/status", {
      token: clientToken,
      headers: { "X-Ashlar-Correlation-Id": sent },
    });
    expect(read.headers.get("x-ashlar-correlation-id")).toBe(sent);
  });

  it("a body correlationId wins over the header", async () => {
    const header = `hdr-${uid()}`;
    const body = `body-${uid()}`;
    const created = await mesh<MeshTask>("POST", "/tasks", {
      token: clientToken,
      json: taskBody({ requiredBrickIds: [`brick-${uid()}`], correlationId: body }),
      headers: { "X-Ashlar-Correlation-Id": header },
    });
    expect(created.status, created.text).toBe(200);
    expect(created.body.correlationId).toBe(body);
    expect((await getTask(created.body.taskId)).correlationId).toBe(body);
  });

  it("schedule with a body correlationId (or a header sent) replaces the task's; without either it is kept", async () => {
    const { brick } = await nodeWithBrick({ maxConcurrency: 4 });
    const original = `orig-${uid()}`;
    const t1 = await createTask({ requiredBrickIds: [brick], correlationId: original });
    const replaced = `sched-${uid()}`;
    const placed = await schedule(t1.taskId, { correlationId: replaced });
    expect(placed.correlationId).toBe(replaced);
    expect((await getTask(t1.taskId)).correlationId).toBe(replaced);

    const t2 = await createTask({ requiredBrickIds: [brick], correlationId: original });
    const header = `hdr-${uid()}`;
    const viaHeader = await mesh<MeshTask>("POST", `/tasks/${t2.taskId}/schedule`, {
      token: clientToken,
      json: {},
      headers: { "X-Ashlar-Correlation-Id": header },
    });
    expect(viaHeader.status, viaHeader.text).toBe(200);
    expect(viaHeader.body.correlationId).toBe(header);

    const t3 = await createTask({ requiredBrickIds: [brick], correlationId: original });
    const kept = await schedule(t3.taskId, {});
    expect(kept.correlationId).toBe(original);
    expect((await getTask(t3.taskId)).correlationId).toBe(original);
  });
});

describe("director REST contract: leases and status reports", () => {
  it("PATCH status needs the lease token: none → 409, another → 409 (state unchanged); the right one → Running, then Succeeded with resultSummary stored", async () => {
    const { task, token } = await assignedTask();
    const id = task.taskId;

    const without = await patchStatus(id, { status: "Running" });
    expectRefusal(without, 409, "aborted", "TOKEN_MISMATCH");
    expect(await getTask(id)).toMatchObject({ status: "Assigned", attempt: 1, startedUtc: null });

    const wrong = await patchStatus(id, { status: "Running", leaseToken: "0".repeat(64) });
    expectRefusal(wrong, 409, "aborted", "TOKEN_MISMATCH");
    expect(await getTask(id)).toMatchObject({ status: "Assigned", attempt: 1, startedUtc: null });

    const running = await patchStatus(id, { status: "Running", leaseToken: token });
    expect(running.status, running.text).toBe(200);
    expect(running.body).toMatchObject({ taskId: id, status: "Running", attempt: 1 });
    expect(running.body.startedUtc).toMatch(MILLIS_UTC);

    const noTokenDone = await patchStatus(id, { status: "Succeeded", resultSummary: "sneaky" });
    expectRefusal(noTokenDone, 409, "aborted", "TOKEN_MISMATCH");
    expect(await getTask(id)).toMatchObject({ status: "Running", resultSummary: null });

    const summary = `42 molecules scored ${uid()}`;
    const done = await patchStatus(id, {
      status: "Succeeded",
      leaseToken: token,
      resultSummary: summary,
    });
    expect(done.status, done.text).toBe(200);
    expect(done.body).toMatchObject({ taskId: id, status: "Succeeded", resultSummary: summary });
    const read = await getTask(id);
    expect(read).toMatchObject({
      status: "Succeeded",
      resultSummary: summary,
      resultHandle: null,
      leaseOwnerPeerId: null,
      leaseExpiresUtc: null,
    });
    expect(read.finishedUtc).toMatch(MILLIS_UTC);

    // The identical report again is 200; a Succeeded task is not scheduled again.
    const repeat = await patchStatus(id, {
      status: "Succeeded",
      leaseToken: token,
      resultSummary: summary,
    });
    expect(repeat.status, repeat.text).toBe(200);
    expect(repeat.body.status).toBe("Succeeded");
    expectRefusal(
      await mesh("POST", `/tasks/${id}/schedule`, { token: clientToken }),
      400,
      "failed_precondition",
      "INVALID_STATE",
    );
  });

  it("PATCH status on a task that never had a lease is 409 TOKEN_MISMATCH (no token names a lease there)", async () => {
    const task = await createTask({ requiredBrickIds: [`brick-${uid()}`] });
    const refused = await patchStatus(task.taskId, {
      status: "Running",
      leaseToken: "a".repeat(64),
    });
    expectRefusal(refused, 409, "aborted", "TOKEN_MISMATCH");
    expect(await getTask(task.taskId)).toMatchObject({ status: "Pending", attempt: 0 });
  });

  it("PATCH status refuses another status name, and a resultHandle with a status other than Succeeded (400)", async () => {
    const { task, token } = await assignedTask();
    for (const status of ["Canceled", "Done", ""]) {
      const refused = await patchStatus(task.taskId, { status, leaseToken: token });
      expectRefusal(refused, 400, "invalid_argument");
    }
    const handleOnRunning = await patchStatus(task.taskId, {
      status: "Running",
      leaseToken: token,
      resultHandle: randomUUID(),
    });
    expectRefusal(handleOnRunning, 400, "invalid_argument");
    expect(await getTask(task.taskId)).toMatchObject({ status: "Assigned", attempt: 1 });
    // Status names are taken in any case, as .NET's enum converters read them.
    const lowercase = await patchStatus(task.taskId, { status: "running", leaseToken: token });
    expect(lowercase.status).toBe(200);
    expect(await getTask(task.taskId)).toMatchObject({ status: "Running", attempt: 1 });
  });

  it("a resultHandle that is a host file path is 400 and never read; the task stays Running", async () => {
    const { task, token } = await assignedTask();
    const id = task.taskId;
    expect((await patchStatus(id, { status: "Running", leaseToken: token })).status).toBe(200);
    for (const handle of [
      "/etc/passwd",
      "C:\\Windows\\win.ini",
      "file:///etc/passwd",
      "../../../../etc/passwd",
    ]) {
      const refused = await patchStatus(id, {
        status: "Succeeded",
        leaseToken: token,
        resultHandle: handle,
      });
      expectRefusal(refused, 400, "invalid_argument");
      expect(refused.text).not.toContain("root:");
      expect(await getTask(id)).toMatchObject({
        status: "Running",
        resultHandle: null,
        result: null,
      });
      const bytes = await resultBytes(id);
      expect(bytes.status).toBe(404);
      expect(bytes.bytes.toString("utf8")).not.toContain("root:");
    }
  });

  it("a resultHandle naming an artifact uploaded for the task completes it, and GET /result streams those bytes", async () => {
    const { node, task, token } = await assignedTask();
    const id = task.taskId;
    expect((await patchStatus(id, { status: "Running", leaseToken: token })).status).toBe(200);
    const content = `result bytes ${uid()}\n`;
    const up = await upload(id, node.workerId, task.attempt, content);
    expect(up.status, up.text).toBe(201);
    // A second output of the same attempt, to report as a different result later.
    const second = await upload(
      id,
      node.workerId,
      task.attempt,
      `other ${uid()}`,
      undefined,
      "b.bin",
    );
    expect(second.status, second.text).toBe(201);
    expect(up.body).toMatchObject({
      sha256: sha256(content),
      size_bytes: Buffer.byteLength(content),
    });

    const done = await patchStatus(id, {
      status: "Succeeded",
      leaseToken: token,
      resultHandle: up.body.artifact_id,
      resultSummary: "ok",
    });
    expect(done.status, done.text).toBe(200);
    expect(done.body).toMatchObject({
      status: "Succeeded",
      resultHandle: up.body.artifact_id,
      resultSummary: "ok",
    });
    const read = await getTask(id);
    expect(read.resultHandle).toBe(up.body.artifact_id);
    expect(read.result).toMatchObject({
      uri: up.body.uri,
      sha256: sha256(content),
      sizeBytes: Buffer.byteLength(content),
    });
    expect(typeof read.result?.contentType).toBe("string");

    const got = await resultBytes(id);
    expect(got.status).toBe(200);
    expect(got.bytes.toString("utf8")).toBe(content);

    // The identical report again is 200; another result for the same attempt is 409.
    const repeat = await patchStatus(id, {
      status: "Succeeded",
      leaseToken: token,
      resultHandle: up.body.artifact_id,
      resultSummary: "ok",
    });
    expect(repeat.status, repeat.text).toBe(200);
    const different = await patchStatus(id, {
      status: "Succeeded",
      leaseToken: token,
      resultHandle: second.body.artifact_id,
      resultSummary: "other",
    });
    expectRefusal(different, 409, "already_exists", "COMPLETION_CONFLICT");
    expect(await getTask(id)).toMatchObject({
      resultHandle: up.body.artifact_id,
      resultSummary: "ok",
    });
  });

  it("a resultHandle may be the artifact's uri; an artifact of another task is 409 ARTIFACT_MISMATCH", async () => {
    const one = await assignedTask();
    const two = await assignedTask();
    const otherContent = `other ${uid()}`;
    const foreign = await upload(
      two.task.taskId,
      two.node.workerId,
      two.task.attempt,
      otherContent,
    );
    expect(foreign.status, foreign.text).toBe(201);

    const mismatch = await patchStatus(one.task.taskId, {
      status: "Succeeded",
      leaseToken: one.token,
      resultHandle: foreign.body.artifact_id,
    });
    expectRefusal(mismatch, 409, "aborted", "ARTIFACT_MISMATCH");
    expect(await getTask(one.task.taskId)).toMatchObject({
      status: "Assigned",
      resultHandle: null,
    });

    const content = `mine ${uid()}`;
    const mine = await upload(one.task.taskId, one.node.workerId, one.task.attempt, content);
    expect(mine.status, mine.text).toBe(201);
    const done = await patchStatus(one.task.taskId, {
      status: "Succeeded",
      leaseToken: one.token,
      resultHandle: mine.body.uri,
    });
    expect(done.status, done.text).toBe(200);
    expect(done.body).toMatchObject({ status: "Succeeded", resultHandle: mine.body.artifact_id });
    const got = await resultBytes(one.task.taskId);
    expect(got.status).toBe(200);
    expect(got.bytes.toString("utf8")).toBe(content);
  });

  it("lease/extend with extendSeconds 3600 moves leaseExpiresUtc about an hour ahead; a wrong token is 409 and changes nothing", async () => {
    const { task, token } = await assignedTask();
    const id = task.taskId;
    expect(secondsAhead(task.leaseExpiresUtc)).toBeLessThan(600 + 120);

    const extended = await mesh<MeshTask>("POST", `/tasks/${id}/lease/extend`, {
      json: { leaseToken: token, extendSeconds: 3600 },
    });
    expect(extended.status, extended.text).toBe(200);
    expect(extended.body).toMatchObject({ taskId: id, status: "Assigned", attempt: 1 });
    expect(extended.body.leaseToken).toBe(token);
    expect(extended.body.leaseExpiresUtc).toMatch(MILLIS_UTC);
    const ahead = secondsAhead(extended.body.leaseExpiresUtc);
    expect(ahead).toBeGreaterThan(3600 - 120);
    expect(ahead).toBeLessThan(3600 + 120);
    expect((await getTask(id)).leaseExpiresUtc).toBe(extended.body.leaseExpiresUtc);

    const wrong = await mesh("POST", `/tasks/${id}/lease/extend`, {
      json: { leaseToken: "f".repeat(64), extendSeconds: 7200 },
    });
    expectRefusal(wrong, 409, "aborted", "TOKEN_MISMATCH");
    const missing = await mesh("POST", `/tasks/${id}/lease/extend`, {
      json: { extendSeconds: 7200 },
    });
    expectRefusal(missing, 409, "aborted");
    expect(await getTask(id)).toMatchObject({
      status: "Assigned",
      leaseExpiresUtc: extended.body.leaseExpiresUtc,
    });

    for (const extendSeconds of [59, 86401]) {
      const out = await mesh("POST", `/tasks/${id}/lease/extend`, {
        json: { leaseToken: token, extendSeconds },
      });
      expectRefusal(out, 400, "invalid_argument");
    }
    // Without extendSeconds: the task's leaseSeconds (600 after a default schedule).
    const byDefault = await mesh<MeshTask>("POST", `/tasks/${id}/lease/extend`, {
      json: { leaseToken: token },
    });
    expect(byDefault.status, byDefault.text).toBe(200);
    expect(secondsAhead(byDefault.body.leaseExpiresUtc)).toBeLessThan(600 + 120);
  });

  it("migrate-for-checkpoint puts the task back to Pending with checkpointHandle; scheduling again grows attempt, gives a new token, and the old token is refused", async () => {
    const { task, token, node } = await assignedTask();
    const id = task.taskId;
    expect((await patchStatus(id, { status: "Running", leaseToken: token })).status).toBe(200);

    const wrong = await mesh("POST", `/tasks/${id}/migrate-for-checkpoint`, {
      json: { leaseToken: "1".repeat(64), checkpointHandle: "ckpt-wrong" },
    });
    expectRefusal(wrong, 409, "aborted", "TOKEN_MISMATCH");
    expect(await getTask(id)).toMatchObject({ status: "Running", checkpointHandle: null });

    const handle = `s3://checkpoints/${uid()}/step-7`;
    const migrated = await mesh<MeshTask>("POST", `/tasks/${id}/migrate-for-checkpoint`, {
      json: { leaseToken: token, checkpointHandle: handle },
    });
    expect(migrated.status, migrated.text).toBe(200);
    expect(migrated.body).toMatchObject({
      taskId: id,
      status: "Pending",
      checkpointHandle: handle,
      leaseOwnerPeerId: null,
      leaseExpiresUtc: null,
      errorCode: null,
    });
    expect(await getTask(id)).toMatchObject({ status: "Pending", checkpointHandle: handle });
    expect((await listNodes()).find((n) => n.peerId === node.peerId)?.activeLeases).toBe(0);

    const again = await schedule(id);
    expect(again.attempt).toBeGreaterThan(task.attempt);
    expect(again.leaseToken).toMatch(/^[0-9a-f]{64}$/);
    expect(again.leaseToken).not.toBe(token);
    expect(again.checkpointHandle).toBe(handle);

    expectRefusal(await patchStatus(id, { status: "Running", leaseToken: token }), 409, "aborted");
    expectRefusal(
      await mesh("POST", `/tasks/${id}/lease/extend`, { json: { leaseToken: token } }),
      409,
      "aborted",
    );
    expect(await getTask(id)).toMatchObject({ status: "Assigned", attempt: again.attempt });
    const running = await patchStatus(id, { status: "Running", leaseToken: again.leaseToken });
    expect(running.status, running.text).toBe(200);
  });

  it("with the worker token that registered the node, lease/extend and migrate-for-checkpoint answer the task, as with an admin token", async () => {
    const { task, token } = await assignedTask({}, workerToken);
    const id = task.taskId;
    const extended = await mesh<MeshTask>("POST", `/tasks/${id}/lease/extend`, {
      token: workerToken,
      json: { leaseToken: token, extendSeconds: 3600 },
    });
    expect(extended.status, extended.text).toBe(200);
    expect(secondsAhead(extended.body.leaseExpiresUtc)).toBeGreaterThan(3600 - 120);
    // docs/rest.md: "→ 200 the task with the new leaseExpiresUtc".
    expect
      .soft(extended.body, extended.text)
      .toMatchObject({ taskId: id, status: "Assigned", attempt: 1, leaseToken: token });

    const handle = `ckpt-${uid()}`;
    const migrated = await mesh<MeshTask>("POST", `/tasks/${id}/migrate-for-checkpoint`, {
      token: workerToken,
      json: { leaseToken: token, checkpointHandle: handle },
    });
    expect(migrated.status, migrated.text).toBe(200);
    // docs/rest.md: "→ 200 the task, Pending, the handle recorded for the next attempt".
    expect
      .soft(migrated.body, migrated.text)
      .toMatchObject({ taskId: id, status: "Pending", checkpointHandle: handle });
    expect(await getTask(id)).toMatchObject({ status: "Pending", checkpointHandle: handle });
  });

  it("PATCH Pending with a checkpointHandle gives the task back, as migrate-for-checkpoint", async () => {
    const { task, token } = await assignedTask();
    const handle = `ckpt-${uid()}`;
    const back = await patchStatus(task.taskId, {
      status: "Pending",
      leaseToken: token,
      checkpointHandle: handle,
    });
    expect(back.status, back.text).toBe(200);
    expect(back.body).toMatchObject({ status: "Pending", checkpointHandle: handle });
    const again = await schedule(task.taskId);
    expect(again.attempt).toBe(task.attempt + 1);
  });

  it("PATCH Failed fails the task for good (errorCode default Failed, resultSummary as the message); retry places it again", async () => {
    const { task, token, node } = await assignedTask();
    const id = task.taskId;
    expect((await patchStatus(id, { status: "Running", leaseToken: token })).status).toBe(200);
    const failed = await patchStatus(id, {
      status: "Failed",
      leaseToken: token,
      resultSummary: "out of memory",
    });
    expect(failed.status, failed.text).toBe(200);
    expect(failed.body).toMatchObject({ status: "Failed", errorCode: "Failed" });
    expect(failed.body.errorMessage).toContain("out of memory");
    expect(await getTask(id)).toMatchObject({
      status: "Failed",
      errorCode: "Failed",
      leaseOwnerPeerId: null,
    });

    // Failed stays Failed: schedule does not take it, retry does.
    expectRefusal(
      await mesh("POST", `/tasks/${id}/schedule`, { token: clientToken }),
      400,
      "failed_precondition",
      "INVALID_STATE",
    );
    const retried = await mesh<MeshTask>("POST", `/tasks/${id}/retry`, {
      token: clientToken,
      json: {},
    });
    expect(retried.status, retried.text).toBe(200);
    expect(retried.body).toMatchObject({
      status: "Assigned",
      attempt: 2,
      assignedPeerId: node.peerId,
      leaseOwnerPeerId: node.peerId,
    });
    expect(retried.body.leaseToken).toMatch(/^[0-9a-f]{64}$/);
    expect(retried.body.leaseToken).not.toBe(token);

    // An explicit errorCode is kept.
    const second = await patchStatus(id, {
      status: "Failed",
      leaseToken: retried.body.leaseToken,
      errorCode: "GPU_LOST",
    });
    expect(second.status, second.text).toBe(200);
    expect(second.body).toMatchObject({ status: "Failed", errorCode: "GPU_LOST" });
  });
});

describe("director REST contract: knowledge", () => {
  const entry = (key: string, extra: Partial<KnowledgeEntry> = {}) => ({
    key,
    value: { rate: 0.1, note: key },
    version: 1,
    updatedAt: "2026-03-01T10:00:00.000Z",
    origin: "coordinator-a",
    ...extra,
  });

  async function exportAll(query = ""): Promise<Record<string, KnowledgeEntry[]>> {
    return expectOk(
      await mesh<Record<string, KnowledgeEntry[]>>("GET", `/knowledge/export${query}`, {
        token: clientToken,
      }),
    );
  }

  it("import counts what it inserted; the same import again leaves everything unchanged; a higher version updates", async () => {
    const a = `adapt-${uid()}`;
    const p = `pattern-${uid()}`;
    const payload = {
      adaptations: [entry(a), entry(`${a}-2`, { kind: "adaptation" })],
      patterns: [entry(p, { value: { steps: [1, 2, 3] } })],
    };
    const first = await mesh<ImportCounts>("POST", "/knowledge/import", {
      token: clientToken,
      json: payload,
    });
    expect(first.status, first.text).toBe(200);
    expect(first.body).toEqual({
      inserted: 3,
      updated: 0,
      unchanged: 0,
      rejected: 0,
      rejections: [],
    });

    const again = await mesh<ImportCounts>("POST", "/knowledge/import", {
      token: clientToken,
      json: payload,
    });
    expect(again.status, again.text).toBe(200);
    expect(again.body).toEqual({
      inserted: 0,
      updated: 0,
      unchanged: 3,
      rejected: 0,
      rejections: [],
    });

    const newer = await mesh<ImportCounts>("POST", "/knowledge/import", {
      token: clientToken,
      json: { adaptations: [entry(a, { version: 2, value: { rate: 0.2 } })], patterns: [] },
    });
    expect(newer.body).toEqual({
      inserted: 0,
      updated: 1,
      unchanged: 0,
      rejected: 0,
      rejections: [],
    });
    const older = await mesh<ImportCounts>("POST", "/knowledge/import", {
      token: clientToken,
      json: { adaptations: [entry(a, { version: 1, value: { rate: 0.9 } })], patterns: [] },
    });
    expect(older.body).toEqual({
      inserted: 0,
      updated: 0,
      unchanged: 1,
      rejected: 0,
      rejections: [],
    });
    const stored = (await exportAll()).adaptations?.find((e) => e.key === a);
    expect(stored).toMatchObject({ kind: "adaptation", version: 2, value: { rate: 0.2 } });
  });

  it("an entry without updatedAt is accepted (taken as updated now), not rejected", async () => {
    const key = `no-time-${uid()}`;
    const { updatedAt: _dropped, ...undated } = entry(key);
    const before = Date.now();
    const imported = await mesh<ImportCounts>("POST", "/knowledge/import", {
      token: clientToken,
      json: { adaptations: [undated], patterns: [] },
    });
    expect(imported.status, imported.text).toBe(200);
    expect(imported.body).toEqual({
      inserted: 1,
      updated: 0,
      unchanged: 0,
      rejected: 0,
      rejections: [],
    });
    const stored = (await exportAll()).adaptations?.find((e) => e.key === key);
    expect(stored).toMatchObject({ kind: "adaptation", key, version: 1, origin: "coordinator-a" });
    expect(Date.parse(stored?.updatedAt ?? "")).toBeGreaterThanOrEqual(before - 60_000);
  });

  it("malformed entries are rejected with group, index, key and reason; the good ones still go in", async () => {
    const good = `good-${uid()}`;
    const noVersion = `nover-${uid()}`;
    const noOrigin = `noorigin-${uid()}`;
    const wrongKind = `wrongkind-${uid()}`;
    const imported = await mesh<ImportCounts>("POST", "/knowledge/import", {
      token: clientToken,
      json: {
        adaptations: [
          entry(good),
          { value: { x: 1 }, version: 1, updatedAt: "2026-03-01T10:00:00.000Z", origin: "o" },
          entry(noVersion, { version: 0 }),
        ],
        patterns: [
          (({ origin: _o, ...rest }) => rest)(entry(noOrigin)),
          entry(wrongKind, { kind: "adaptation" }),
        ],
      },
    });
    expect(imported.status, imported.text).toBe(200);
    expect(imported.body).toMatchObject({ inserted: 1, updated: 0, unchanged: 0, rejected: 4 });
    const rejections = [...imported.body.rejections].sort((x, y) =>
      `${x.group}${x.index}`.localeCompare(`${y.group}${y.index}`),
    );
    expect(rejections.map(({ group, index }) => ({ group, index }))).toEqual([
      { group: "adaptations", index: 1 },
      { group: "adaptations", index: 2 },
      { group: "patterns", index: 0 },
      { group: "patterns", index: 1 },
    ]);
    expect(rejections.map((r) => r.key)).toEqual(["", noVersion, noOrigin, wrongKind]);
    for (const r of rejections) {
      expect(typeof r.reason).toBe("string");
      expect(r.reason.length).toBeGreaterThan(0);
    }
    const exported = await exportAll();
    expect(exported.adaptations?.some((e) => e.key === good)).toBe(true);
    const keys = [...(exported.adaptations ?? []), ...(exported.patterns ?? [])].map((e) => e.key);
    for (const k of [noVersion, noOrigin, wrongKind]) expect(keys).not.toContain(k);
  });

  it("export returns {adaptations, patterns} (and other <kind>s groups) with what was imported; re-importing the export changes nothing", async () => {
    const a = `exp-a-${uid()}`;
    const p = `exp-p-${uid()}`;
    const r = `exp-r-${uid()}`;
    const imported = await mesh<ImportCounts>("POST", "/knowledge/import", {
      token: clientToken,
      json: {
        adaptations: [entry(a, { value: { lr: 0.01 }, version: 3, origin: "coord-x" })],
        patterns: [
          entry(p, { value: { shape: "fan-out" }, updatedAt: "2026-04-05T06:07:08.123Z" }),
        ],
        recipes: [entry(r, { value: { steps: ["mix"] } })],
      },
    });
    expect(imported.body).toMatchObject({ inserted: 3, rejected: 0 });

    const exported = await exportAll();
    expect(Array.isArray(exported.adaptations)).toBe(true);
    expect(Array.isArray(exported.patterns)).toBe(true);
    const ea = exported.adaptations?.find((e) => e.key === a);
    expect(ea).toMatchObject({
      kind: "adaptation",
      key: a,
      value: { lr: 0.01 },
      version: 3,
      origin: "coord-x",
    });
    expect(Date.parse(ea?.updatedAt ?? "")).toBe(Date.parse("2026-03-01T10:00:00.000Z"));
    const ep = exported.patterns?.find((e) => e.key === p);
    expect(ep).toMatchObject({ kind: "pattern", key: p, value: { shape: "fan-out" }, version: 1 });
    expect(Date.parse(ep?.updatedAt ?? "")).toBe(Date.parse("2026-04-05T06:07:08.123Z"));
    expect(exported.recipes?.find((e) => e.key === r)).toMatchObject({
      kind: "recipe",
      value: { steps: ["mix"] },
    });

    const onlyPatterns = await exportAll("?kind=pattern");
    expect(onlyPatterns.adaptations).toEqual([]);
    expect(onlyPatterns.patterns?.some((e) => e.key === p)).toBe(true);

    const back = await mesh<ImportCounts>("POST", "/knowledge/import", {
      token: clientToken,
      json: exported,
    });
    expect(back.status, back.text).toBe(200);
    const total = Object.values(exported).reduce((n, group) => n + group.length, 0);
    expect(back.body).toEqual({
      inserted: 0,
      updated: 0,
      unchanged: total,
      rejected: 0,
      rejections: [],
    });
  });
});

describe("director REST contract: roles", () => {
  it("a client token cannot register a node (403) but can create and schedule tasks", async () => {
    const peerId = `peer-${uid()}`;
    const brick = `brick-${uid()}`;
    const refused = await mesh("POST", "/fleet/nodes", {
      token: clientToken,
      json: nodeBody({ peerId, advertisedBrickIds: [brick] }),
    });
    expectRefusal(refused, 403, "permission_denied", "PERMISSION_DENIED");
    expect((await listNodes()).some((n) => n.peerId === peerId)).toBe(false);

    const node = await registerNode({ peerId, advertisedBrickIds: [brick] }, workerToken);
    const task = await createTask({ requiredBrickIds: [brick] }, clientToken);
    const placed = await schedule(task.taskId, {}, clientToken);
    expect(placed.assignedPeerId).toBe(node.peerId);

    // A client does not report on a lease.
    const patch = await patchStatus(
      task.taskId,
      { status: "Running", leaseToken: placed.leaseToken },
      clientToken,
    );
    expectRefusal(patch, 403, "permission_denied");
    expect(await getTask(task.taskId)).toMatchObject({ status: "Assigned" });
  });

  it("a worker token cannot create or list tasks (403)", async () => {
    const brick = `brick-${uid()}`;
    const created = await mesh("POST", "/tasks", {
      token: workerToken,
      json: taskBody({ requiredBrickIds: [brick] }),
    });
    expectRefusal(created, 403, "permission_denied", "PERMISSION_DENIED");
    const listed = await mesh("GET", `/tasks?workload=${brick}`, { token: workerToken });
    expectRefusal(listed, 403, "permission_denied");
    const none = expectOk(
      await mesh<{ tasks: MeshTask[] }>("GET", `/tasks?workload=${brick}`, { token: clientToken }),
    );
    expect(none.tasks).toEqual([]);
  });

  it("a worker token cannot act for a node another worker token registered (403 FOREIGN_WORKER_TOKEN), and nothing changes", async () => {
    const { node, task, token } = await assignedTask({}, workerToken);

    const patch = await patchStatus(
      task.taskId,
      { status: "Running", leaseToken: token },
      otherWorkerToken,
    );
    expectRefusal(patch, 403, "permission_denied", "FOREIGN_WORKER_TOKEN");
    expect(await getTask(task.taskId)).toMatchObject({ status: "Assigned", attempt: 1 });

    const extend = await mesh("POST", `/tasks/${task.taskId}/lease/extend`, {
      token: otherWorkerToken,
      json: { leaseToken: token, extendSeconds: 3600 },
    });
    expectRefusal(extend, 403, "permission_denied", "FOREIGN_WORKER_TOKEN");

    const takeover = await mesh("POST", "/fleet/nodes", {
      token: otherWorkerToken,
      json: nodeBody({ peerId: node.peerId, apiBaseUrl: "https://evil.example/" }),
    });
    expectRefusal(takeover, 403, "permission_denied", "FOREIGN_WORKER_TOKEN");
    const beat = await mesh("POST", `/fleet/nodes/${node.peerId}/heartbeat`, {
      token: otherWorkerToken,
      json: { queueDepth: 99 },
    });
    expectRefusal(beat, 403, "permission_denied", "FOREIGN_WORKER_TOKEN");
    const drain = await mesh("POST", `/fleet/nodes/${node.peerId}/drain`, {
      token: otherWorkerToken,
      json: { drained: true },
    });
    expectRefusal(drain, 403, "permission_denied", "FOREIGN_WORKER_TOKEN");
    const removal = await mesh("DELETE", `/fleet/nodes/${node.peerId}`, {
      token: otherWorkerToken,
    });
    expectRefusal(removal, 403, "permission_denied", "FOREIGN_WORKER_TOKEN");

    const still = (await listNodes()).find((n) => n.peerId === node.peerId);
    expect(still).toMatchObject({
      apiBaseUrl: node.apiBaseUrl,
      drained: false,
      queueDepth: 0,
      activeLeases: 1,
    });

    // Its own token may.
    const own = await patchStatus(
      task.taskId,
      { status: "Running", leaseToken: token },
      workerToken,
    );
    expect(own.status, own.text).toBe(200);
    expect(own.body.status).toBe("Running");
  });

  it("no token (or an unknown one) is 401 with {error: unauthenticated, message}", async () => {
    for (const [method, path] of [
      ["GET", "/fleet/nodes"],
      ["POST", "/tasks"],
      ["GET", "/elastic/status"],
      ["GET", "/knowledge/export"],
    ] as const) {
      const anonymous = await mesh(method, path, {
        token: null,
        ...(method === "POST" ? { json: taskBody({ requiredBrickIds: [`b-${uid()}`] }) } : {}),
      });
      expectRefusal(anonymous, 401, "unauthenticated");
    }
    const forged = await mesh("GET", "/fleet/nodes", { token: `mw_${"A".repeat(43)}` });
    expectRefusal(forged, 401, "unauthenticated");
    const result = await resultBytes(randomUUID(), "not-a-token");
    expect(result.status).toBe(401);
  });
});

describe("director REST contract: push mode end to end", () => {
  it("register → create → schedule → Running → lease/extend → upload → Succeeded with resultHandle → GET task → GET result → elastic/status counts it", async () => {
    const countsBefore = expectOk(
      await mesh<{ taskCounts: Record<string, number> }>("GET", "/elastic/status", {
        token: clientToken,
      }),
    ).taskCounts;

    const brick = `render-${uid()}`;
    const peerId = `farm-${uid()}`;
    const node = await registerNode(
      {
        peerId,
        apiBaseUrl: `https://${peerId}.tailnet:8080/`,
        labels: { region: "us-west" },
        advertisedBrickIds: [brick],
        drained: false,
      },
      workerToken,
    );

    const correlation = `flow-${uid()}`;
    const created = await mesh<MeshTask>("POST", "/tasks", {
      token: clientToken,
      json: taskBody({
        name: "frame-0001",
        requiredBrickIds: [brick],
        affinity: { region: "us-west" },
        idempotencyKey: `flow-${uid()}`,
      }),
      headers: { "X-Ashlar-Correlation-Id": correlation },
    });
    expect(created.status, created.text).toBe(200);
    expect(created.body).toMatchObject({ status: "Pending", correlationId: correlation });
    const id = created.body.taskId;

    const placed = await schedule(id, { scheduleIdempotencyKey: `s-${uid()}` });
    expect(placed).toMatchObject({
      assignedPeerId: peerId,
      assignedApiBaseUrl: node.apiBaseUrl,
      leaseOwnerPeerId: peerId,
      attempt: 1,
    });
    const token = placed.leaseToken as string;

    const running = await patchStatus(id, { status: "Running", leaseToken: token }, workerToken);
    expect(running.status, running.text).toBe(200);
    expect(running.body.status).toBe("Running");

    const extended = await mesh<MeshTask>("POST", `/tasks/${id}/lease/extend`, {
      token: workerToken,
      json: { leaseToken: token, extendSeconds: 1800 },
    });
    expect(extended.status, extended.text).toBe(200);
    // docs/rest.md: lease/extend answers "the task with the new leaseExpiresUtc".
    expect.soft(extended.body.status, extended.text).toBe("Running");
    expect(secondsAhead(extended.body.leaseExpiresUtc)).toBeGreaterThan(1800 - 120);

    const content = `frame 0001 rendered ${uid()}`;
    const up = await upload(
      id,
      node.workerId,
      placed.attempt,
      content,
      workerToken,
      "frame-0001.png",
    );
    expect(up.status, up.text).toBe(201);
    expect(up.body.sha256).toBe(sha256(content));

    const done = await patchStatus(
      id,
      {
        status: "Succeeded",
        leaseToken: token,
        resultHandle: up.body.artifact_id,
        resultSummary: "1 frame",
      },
      workerToken,
    );
    expect(done.status, done.text).toBe(200);
    expect(done.body.status).toBe("Succeeded");

    const read = await getTask(id);
    expect(read).toMatchObject({
      status: "Succeeded",
      resultHandle: up.body.artifact_id,
      resultSummary: "1 frame",
      correlationId: correlation,
      leaseToken: null,
      leaseOwnerPeerId: null,
      leaseExpiresUtc: null,
      assignedPeerId: peerId,
    });
    expect(read.result).toMatchObject({ uri: up.body.uri, sha256: sha256(content) });
    expect(read.startedUtc).toMatch(MILLIS_UTC);
    expect(read.finishedUtc).toMatch(MILLIS_UTC);

    const bytes = await resultBytes(id);
    expect(bytes.status).toBe(200);
    expect(bytes.bytes.toString("utf8")).toBe(content);

    const after = expectOk(
      await mesh<{ taskCounts: Record<string, number>; workers: Body[] }>(
        "GET",
        "/elastic/status",
        {
          token: clientToken,
        },
      ),
    );
    expect(after.taskCounts.Succeeded).toBe((countsBefore.Succeeded ?? 0) + 1);
    // Registered without maxConcurrency: no slot limit, so no count of free slots.
    expect(after.workers.find((w) => w.peerId === peerId)).toMatchObject({
      activeLeases: 0,
      maxConcurrency: null,
      freeSlots: null,
    });
  });
});

describe("director REST contract: bad input", () => {
  async function tasksOf(workload: string): Promise<MeshTask[]> {
    return expectOk(
      await mesh<{ tasks: MeshTask[] }>("GET", `/tasks?workload=${workload}`, {
        token: clientToken,
      }),
    ).tasks;
  }

  it("invalid JSON is 400 invalid_argument and creates nothing", async () => {
    const brick = `brick-${uid()}`;
    const broken = await mesh("POST", "/tasks", {
      token: clientToken,
      raw: `{"name":"x","requiredBrickIds":["${brick}"],`,
    });
    expectRefusal(broken, 400, "invalid_argument");
    const notObject = await mesh("POST", "/tasks", {
      token: clientToken,
      raw: JSON.stringify([{ requiredBrickIds: [brick] }]),
    });
    expectRefusal(notObject, 400, "invalid_argument");
    expect(await tasksOf(brick)).toEqual([]);

    const badNode = await mesh("POST", "/fleet/nodes", { raw: "{peerId: nope}" });
    expectRefusal(badNode, 400, "invalid_argument");
  });

  it("an unknown (or misspelt) field is 400 and creates nothing", async () => {
    const brick = `brick-${uid()}`;
    const unknown = await mesh("POST", "/tasks", {
      token: clientToken,
      json: { ...taskBody({ requiredBrickIds: [brick] }), colour: "blue" },
    });
    expectRefusal(unknown, 400, "invalid_argument");
    const misspelt = await mesh("POST", "/tasks", {
      token: clientToken,
      json: { name: "x", requiredBrickId: [brick], workload: brick },
    });
    expectRefusal(misspelt, 400, "invalid_argument");
    expect(await tasksOf(brick)).toEqual([]);

    const peerId = `peer-${uid()}`;
    const nodeTypo = await mesh("POST", "/fleet/nodes", {
      json: { ...nodeBody({ peerId }), advertisedBricks: [brick] },
    });
    expectRefusal(nodeTypo, 400, "invalid_argument");
    expect((await listNodes()).some((n) => n.peerId === peerId)).toBe(false);

    const { task, token } = await assignedTask();
    const patchTypo = await patchStatus(task.taskId, {
      status: "Running",
      leaseToken: token,
      leasetoken: token,
    });
    expectRefusal(patchTypo, 400, "invalid_argument");
    expect(await getTask(task.taskId)).toMatchObject({ status: "Assigned" });
  });

  it("a lone surrogate or U+0000 anywhere in a body is 400 naming the field, and stores nothing", async () => {
    const brick = `brick-${uid()}`;
    // JSON.stringify writes a lone surrogate as the escape "\ud800", as a client's JSON may.
    for (const [parameters, named] of [
      [{ k: ["a\ud800"] }, "parameters.k[0]"],
      [{ "\udfff": 1 }, 'parameters["\\udfff"]'],
      [{ k: "a\u0000b" }, "parameters.k"],
    ] as const) {
      const refused = await mesh<{ message: string }>("POST", "/tasks", {
        token: clientToken,
        json: taskBody({ requiredBrickIds: [brick], workload: brick, parameters }),
      });
      expectRefusal(refused, 400, "invalid_argument");
      expect(refused.body.message).toContain(named);
    }
    expect(await tasksOf(brick)).toEqual([]);

    const { task, token } = await assignedTask();
    const summary = await patchStatus(task.taskId, {
      status: "Succeeded",
      leaseToken: token,
      resultSummary: "done \ud800",
    });
    expectRefusal(summary, 400, "invalid_argument");
    expect(await getTask(task.taskId)).toMatchObject({ status: "Assigned" });
  });

  it("priority as a string is 400 and creates nothing", async () => {
    const brick = `brick-${uid()}`;
    for (const priority of ["high", "1"]) {
      const refused = await mesh("POST", "/tasks", {
        token: clientToken,
        json: { ...taskBody({ requiredBrickIds: [brick] }), priority },
      });
      expectRefusal(refused, 400, "invalid_argument");
    }
    expect(await tasksOf(brick)).toEqual([]);
  });

  it("a task without workload or requiredBrickIds is 400; null is the same as leaving a field out", async () => {
    const none = await mesh("POST", "/tasks", {
      token: clientToken,
      json: { name: `x-${uid()}`, steps: 1, requiredBrickIds: [], affinity: {}, priority: 0 },
    });
    expectRefusal(none, 400, "invalid_argument");

    const brick = `brick-${uid()}`;
    const nulls = await mesh<MeshTask>("POST", "/tasks", {
      token: clientToken,
      json: {
        name: null,
        steps: null,
        requiredBrickIds: [brick],
        affinity: null,
        priority: null,
        deadlineUtc: null,
        idempotencyKey: null,
        correlationId: null,
        parameters: null,
      },
    });
    expect(nulls.status, nulls.text).toBe(200);
    expect(nulls.body).toMatchObject({ status: "Pending", workload: brick, priority: 0 });
  });

  it("an unknown taskId is 404 and a taskId that is not a UUID is 400, on every task route", async () => {
    const unknown = randomUUID();
    const routes: [string, string, Body | undefined][] = [
      ["GET", "", undefined],
      ["POST", "/schedule", {}],
      ["POST", "/retry", {}],
      ["POST", "/lease/extend", { leaseToken: "a".repeat(64) }],
      ["POST", "/migrate-for-checkpoint", { leaseToken: "a".repeat(64), checkpointHandle: "c" }],
      ["PATCH", "/status", { status: "Running", leaseToken: "a".repeat(64) }],
    ];
    for (const [method, suffix, json] of routes) {
      const missing = await mesh(method, `/tasks/${unknown}${suffix}`, { json });
      expectRefusal(missing, 404, "not_found");
      const malformed = await mesh(method, `/tasks/not-a-uuid${suffix}`, { json });
      expectRefusal(malformed, 400, "invalid_argument");
    }
    const result = await mesh("GET", "/tasks/not-a-uuid/result");
    expect(result.status).toBe(400);
  });

  it("no redirects: a trailing slash or a path that is not a route is 404", async () => {
    for (const path of ["/api/mesh/tasks/", "/api/mesh/fleet/nodes/", "/api/mesh/nothing-here"]) {
      const res = await call("GET", path, { token: clientToken });
      expect(res.status, `${path}: ${res.text}`).toBe(404);
      expect(res.headers.get("location")).toBeNull();
    }
  });
});

describe("director REST contract: workflows", () => {
  it("POST /tasks takes delaySeconds, runAtUtc, dependsOn, dependencyPolicy and timeoutSeconds; GET reads them back with the dependency's outputs and resultValue", async () => {
    const { brick, node } = await nodeWithBrick();
    const first = await createTask({ requiredBrickIds: [brick] });
    expect(first).toMatchObject({
      ref: null,
      runAtUtc: null,
      dependsOn: [],
      dependencyPolicy: "AllSucceeded",
      dependenciesPending: 0,
      dependencyOutputs: {},
      timeoutSeconds: null,
      resultValue: null,
    });
    const after = await createTask({
      requiredBrickIds: [brick],
      dependsOn: [first.taskId],
      dependencyPolicy: "AllDone",
      timeoutSeconds: 300,
    } as TaskRequest);
    expect(after).toMatchObject({
      dependsOn: [first.taskId],
      dependencyPolicy: "AllDone",
      dependenciesPending: 1,
      timeoutSeconds: 300,
    });
    const waiting = await mesh<Body>("GET", `/tasks/${after.taskId}`, { token: clientToken });
    expect(expectOk(waiting).waiting).toMatchObject([{ kind: "DEPENDENCIES" }]);
    const early = await mesh("POST", `/tasks/${after.taskId}/schedule`, { token: clientToken });
    expectRefusal(early, 400, "failed_precondition", "INVALID_STATE");

    const before = Date.now();
    const delayed = await createTask({
      requiredBrickIds: [brick],
      delaySeconds: 3600,
    } as TaskRequest);
    const runAt = String((delayed as unknown as Body).runAtUtc);
    expect(runAt).toMatch(MILLIS_UTC);
    expect(Date.parse(runAt) - before).toBeGreaterThanOrEqual(3_599_000);
    expect(Date.parse(runAt) - Date.now()).toBeLessThanOrEqual(3_600_000);
    const at = new Date(Date.now() + 7_200_000).toISOString();
    const timed = await createTask({ requiredBrickIds: [brick], runAtUtc: at } as TaskRequest);
    expect((await getTask(timed.taskId)) as unknown as Body).toMatchObject({
      runAtUtc: at,
      waiting: [{ kind: "NOT_BEFORE" }],
    });
    const notYet = await mesh("POST", `/tasks/${timed.taskId}/schedule`, { token: clientToken });
    expectRefusal(notYet, 400, "failed_precondition", "INVALID_STATE");

    // The first task runs and succeeds with a result artifact and a resultValue.
    const placed = await schedule(first.taskId);
    const token = placed.leaseToken as string;
    expectOk(await patchStatus(first.taskId, { status: "Running", leaseToken: token }));
    const up = expectOk(
      await upload(first.taskId, node.workerId, 1, "frames", undefined, "a.bin"),
      201,
    );
    const done = expectOk(
      await patchStatus(first.taskId, {
        status: "Succeeded",
        leaseToken: token,
        resultHandle: up.artifact_id,
        resultValue: { frames: 24, ok: true },
      }),
    );
    expect((done as unknown as Body).resultValue).toEqual({ frames: 24, ok: true });
    expect(((await getTask(first.taskId)) as unknown as Body).resultValue).toEqual({
      frames: 24,
      ok: true,
    });
    expect((await getTask(after.taskId)) as unknown as Body).toMatchObject({
      dependenciesPending: 0,
      dependencyOutputs: {
        [`${first.taskId}/a.bin`]: up.artifact_id,
        [`${first.taskId}/result`]: up.artifact_id,
      },
    });
  });

  it("refuses a bad runAtUtc, both start fields, an unknown dependency, a bad policy or timeout: 400, nothing created", async () => {
    const { brick } = await nodeWithBrick();
    const bad: Body[] = [
      { runAtUtc: "tomorrow" },
      { runAtUtc: "2026-07-23 12:05" },
      { runAtUtc: new Date(Date.now() + 400 * 86_400_000).toISOString() },
      { runAtUtc: new Date().toISOString(), delaySeconds: 10 },
      { delaySeconds: -5 },
      { delaySeconds: "60" },
      { dependsOn: [randomUUID()] },
      { dependsOn: ["not a task"] },
      { dependsOn: ["ref:other"] },
      { dependencyPolicy: "Sometimes" },
      { timeoutSeconds: 0 },
      { timeoutSeconds: 604_801 },
    ];
    for (const extra of bad) {
      const a = await mesh("POST", "/tasks", {
        token: clientToken,
        json: taskBody({ requiredBrickIds: [brick], ...extra } as TaskRequest),
      });
      expectRefusal(a, 400, "invalid_argument");
    }
    const list = await mesh<{ tasks: MeshTask[] }>("GET", `/tasks?workload=${brick}`, {
      token: clientToken,
    });
    expect(expectOk(list).tasks).toEqual([]);
  });

  it("PATCH status refuses a resultValue over 64 KiB or with another status than Succeeded (400), the task still Running", async () => {
    const { task, token } = await assignedTask();
    expectOk(await patchStatus(task.taskId, { status: "Running", leaseToken: token }));
    const big = { status: "Succeeded", leaseToken: token, resultValue: { s: "x".repeat(70_000) } };
    expectRefusal(await patchStatus(task.taskId, big), 400, "invalid_argument");
    const failed = { status: "Failed", leaseToken: token, resultValue: { a: 1 } };
    expectRefusal(await patchStatus(task.taskId, failed), 400, "invalid_argument");
    const notObject = { status: "Succeeded", leaseToken: token, resultValue: [1] };
    expectRefusal(await patchStatus(task.taskId, notObject), 400, "invalid_argument");
    const now = (await getTask(task.taskId)) as unknown as Body;
    expect(now).toMatchObject({ status: "Running", resultValue: null });
  });

  it("after an attempt ran past timeoutSeconds, the lease routes are 409 aborted TIMEOUT", async () => {
    const { brick } = await nodeWithBrick();
    const created = await createTask({
      requiredBrickIds: [brick],
      timeoutSeconds: 1,
      maxAttempts: 1,
    } as TaskRequest);
    const placed = await schedule(created.taskId);
    expect((placed as unknown as Body).timeoutSeconds).toBe(1);
    const leaseToken = placed.leaseToken as string;
    expectOk(await patchStatus(created.taskId, { status: "Running", leaseToken }));
    // The sweeper (every second here) fails the attempt once it has run past its bound.
    let task = await getTask(created.taskId);
    for (let i = 0; i < 200 && task.status !== "Failed"; i++) {
      await new Promise((r) => setTimeout(r, 50));
      task = await getTask(created.taskId);
    }
    expect(task).toMatchObject({ status: "Failed", errorCode: "TIMEOUT" });
    const extend = { leaseToken, extendSeconds: 600 };
    const path = `/tasks/${created.taskId}`;
    expectRefusal(
      await mesh("POST", `${path}/lease/extend`, { json: extend }),
      409,
      "aborted",
      "TIMEOUT",
    );
    const done = { status: "Succeeded", leaseToken, resultValue: { late: true } };
    expectRefusal(await patchStatus(created.taskId, done), 409, "aborted", "TIMEOUT");
    expect(await getTask(created.taskId)).toEqual(task);
  });
});
