import type { JsonObject } from "@bufbuild/protobuf";
import { create } from "@bufbuild/protobuf";
import { type Timestamp, timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService, type Worker, WorkerState } from "../../gen/meshwork/v1/fleet_pb.js";
import {
  type KnowledgeEntry,
  KnowledgeEntrySchema,
  KnowledgeService,
} from "../../gen/meshwork/v1/knowledge_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { type Task, TaskSchema, TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import type { Principal } from "../auth/principal.js";
import type { Correlation } from "../core/context.js";
import { DomainError, invalid } from "../core/errors.js";
import { isUuid } from "../core/validate.js";
import { sendJson } from "../http/json.js";
import { refusalJson } from "../http/refusal-json.js";
import type { PlainRoute, Request, Response } from "../http/routes.js";
import { field, type JsonBody, parseTime, readJson } from "./body.js";
import type { InProcessCaller } from "./in-process.js";
import { rolesOf } from "./roles.js";
import { signalOf } from "./worker.js";

/** The lease a task holds (or last held): what the director routes need to name it. */
export interface LeaseOf {
  workerId: string;
  attempt: number;
}

export interface DirectorDeps {
  call: InProcessCaller;
  maxBodyBytes: number;
  /**
   * The holder and attempt of the lease `leaseToken` names on a task (its
   * current or last one), or null when the token does not name it;
   * `not_found` for an unknown task. The director contract names a lease
   * by its token alone: this maps it to the lease fields the RPCs take,
   * which then check everything again.
   */
  leaseOf(taskId: string, leaseToken: string): Promise<LeaseOf | null>;
  /** A task as GetTask shows it, for the answer of a lease route its holder called. */
  readTask(taskId: string): Promise<Task>;
}

/** A task state as the director contract spells it. */
const statusName: Record<TaskState, string | null> = {
  [TaskState.UNSPECIFIED]: null,
  [TaskState.PENDING]: "Pending",
  [TaskState.ASSIGNED]: "Assigned",
  [TaskState.RUNNING]: "Running",
  [TaskState.SUCCEEDED]: "Succeeded",
  [TaskState.FAILED]: "Failed",
  [TaskState.CANCELED]: "Canceled",
};

const iso = (t: Timestamp | undefined): string | null =>
  t ? timestampDate(t).toISOString() : null;
const orNull = (s: string): string | null => (s === "" ? null : s);

/** One request's view of the RPCs, with a cache of worker id → peer id. */
function session(
  deps: DirectorDeps,
  principal: Principal,
  correlation: Correlation,
  res: Response,
  body: AsyncIterable<Uint8Array>,
) {
  const caller = { principal, correlation, signal: signalOf(res) };
  const clients = {
    fleet: deps.call(FleetService, caller),
    tasks: deps.call(TaskService, caller),
    leases: deps.call(LeaseService, caller),
    artifacts: deps.call(ArtifactService, caller),
    knowledge: deps.call(KnowledgeService, caller),
  };
  const peers = new Map<string, Promise<string>>();

  /** A worker's peer id: its peer_id, else its worker_id (also when it is gone). */
  function peerOf(workerId: string): Promise<string> {
    let peer = peers.get(workerId);
    if (!peer) {
      peer = clients.fleet.getWorker({ workerId }).then(
        ({ worker }) => worker?.peerId || workerId,
        () => workerId,
      );
      peers.set(workerId, peer);
    }
    return peer;
  }

  /** The worker a peer id names (its peer_id, or the worker_id of one registered without). */
  async function workerOf(peerId: string): Promise<Worker> {
    const { worker } = await clients.fleet.getWorker({ peerId });
    if (!worker) throw new Error("GetWorker returned no worker");
    return worker;
  }

  async function taskJson(t: Task) {
    const holder = t.lease?.workerId ?? "";
    const live = t.state === TaskState.ASSIGNED || t.state === TaskState.RUNNING;
    return {
      taskId: t.taskId,
      name: t.name,
      status: statusName[t.state],
      workload: t.workload,
      steps: t.steps ?? null,
      requiredBrickIds: t.requiredCapabilities,
      affinity: t.affinity,
      priority: t.priority,
      deadlineUtc: iso(t.deadline),
      parameters: t.parameters ?? null,
      idempotencyKey: orNull(t.idempotencyKey),
      correlationId: orNull(t.correlationId),
      attempt: t.attempt,
      maxAttempts: t.maxAttempts,
      leaseSeconds: t.leaseSeconds,
      leaseToken: orNull(t.lease?.leaseToken ?? ""),
      leaseOwnerPeerId: live && holder ? await peerOf(holder) : null,
      leaseExpiresUtc: live ? iso(t.lease?.expiresAt) : null,
      checkpointHandle: orNull(t.checkpointHandle),
      assignedPeerId: t.assignedWorkerId ? await peerOf(t.assignedWorkerId) : null,
      assignedApiBaseUrl: orNull(t.assignedApiBaseUrl),
      progress: t.progress
        ? { completedSteps: t.progress.completedSteps, message: t.progress.message }
        : null,
      resultSummary: orNull(t.resultSummary),
      resultHandle: t.result ? t.result.artifactId : null,
      result: t.result
        ? {
            artifactId: t.result.artifactId,
            uri: t.result.uri,
            sha256: t.result.sha256,
            sizeBytes: Number(t.result.sizeBytes),
            contentType: t.result.contentType,
          }
        : null,
      // Not `error`: a refusal's body (409 with the task) has `error`, `message`, `reason`.
      errorCode: orNull(t.error?.code ?? ""),
      errorMessage: orNull(t.error?.message ?? ""),
      cancelRequested: t.cancelRequested,
      createdUtc: iso(t.createdAt),
      updatedUtc: iso(t.updatedAt),
      startedUtc: iso(t.startedAt),
      finishedUtc: iso(t.finishedAt),
    };
  }

  /** The request's JSON body (body.ts, readJson). */
  const json = (known: readonly string[] | "any", options?: { optional?: boolean }) =>
    readJson(body, deps.maxBodyBytes, known, options);
  return { ...clients, peerOf, workerOf, taskJson, json };
}

type Session = ReturnType<typeof session>;

/** A worker as a fleet node. */
function nodeJson(w: Worker) {
  return {
    peerId: w.peerId || w.workerId,
    workerId: w.workerId,
    name: w.name,
    apiBaseUrl: w.apiBaseUrl,
    labels: w.labels,
    advertisedBrickIds: w.capabilities,
    drained: w.drained,
    state: w.state === WorkerState.LOST ? "Lost" : "Active",
    queueDepth: w.queueDepth,
    activeLeases: w.activeLeases,
    // null: no slot limit (a node registered without one).
    maxConcurrency: w.maxConcurrency === 0 ? null : w.maxConcurrency,
    cpuCount: w.cpuCount,
    memoryMb: Number(w.memoryMb),
    registeredUtc: iso(w.registeredAt),
    lastHeartbeatUtc: iso(w.lastHeartbeatAt),
  };
}

/** The director's `status` names (any case) as task states a worker may report. */
const reportable: Record<string, TaskState> = {
  running: TaskState.RUNNING,
  succeeded: TaskState.SUCCEEDED,
  failed: TaskState.FAILED,
  pending: TaskState.PENDING,
};

/**
 * The director REST contract under `/api/mesh` (camelCase JSON): the fleet
 * registry by peer id, tasks and push placement, leases named by their
 * token, status reports, results and knowledge export/import. Each route is
 * an adapter over the RPCs, called in process (in-process.ts) with the
 * caller's token: every rule, auth included, is the RPC's. A peer id is a
 * worker's `peer_id` (or, for a worker registered without one, its
 * worker_id). Every answer echoes `X-Ashlar-Correlation-Id`.
 */
export function directorRestRoutes(deps: DirectorDeps): PlainRoute[] {
  const _max = deps.maxBodyBytes;
  const route = (
    methods: string[],
    path: string,
    rpcs: string[],
    what: string,
    handle: (s: Session, req: Request, match: RegExpExecArray) => Promise<[number, unknown]>,
  ): PlainRoute => ({
    methods,
    pattern: new RegExp(`^/api/mesh${path.replaceAll("{id}", "([^/]+)")}$`),
    roles: rolesOf(...rpcs),
    what,
    async handle({ req, res, match, principal, correlation, body }) {
      res.setHeader("x-ashlar-correlation-id", correlation.id);
      const s = session(deps, principal, correlation, res, body);
      try {
        const [status, body] = await handle(s, req, match);
        sendJson(res, status, body);
      } catch (error) {
        if (await sentAsConflictWithTask(s, res, error)) return;
        throw error;
      }
    },
  });

  /** The lease fields of a lease-bound call on `taskId`, named by the body's leaseToken. */
  async function leaseRef(taskId: string, leaseToken: string | undefined) {
    if (!isUuid(taskId)) throw invalid("taskId must be a UUID");
    const lease = leaseToken ? await deps.leaseOf(taskId.toLowerCase(), leaseToken) : null;
    if (!lease) {
      throw new DomainError(
        "aborted",
        "TOKEN_MISMATCH",
        leaseToken
          ? "leaseToken does not name this task's lease"
          : "leaseToken is required: it names the task's lease",
        { taskId },
      );
    }
    return { taskId, workerId: lease.workerId, attempt: lease.attempt, leaseToken };
  }

  const taskFields = [
    "name",
    "workload",
    "steps",
    "requiredBrickIds",
    "affinity",
    "priority",
    "deadlineUtc",
    "parameters",
    "idempotencyKey",
    "correlationId",
    "maxAttempts",
    "leaseSeconds",
    "inputArtifactId",
  ];
  const placementFields = ["scheduleIdempotencyKey", "correlationId", "leaseSeconds"];

  return [
    route(["GET"], "/fleet/nodes", ["FleetService/ListWorkers"], "list fleet nodes", async (s) => {
      const nodes = [];
      let pageToken = "";
      do {
        const page = await s.fleet.listWorkers({ pageSize: 1000, pageToken });
        nodes.push(...page.workers.map(nodeJson));
        pageToken = page.nextPageToken;
      } while (pageToken !== "");
      return [200, nodes];
    }),

    route(
      ["POST"],
      "/fleet/nodes",
      ["FleetService/RegisterWorker"],
      "register a fleet node",
      async (s, _req) => {
        const body = await s.json([
          "peerId",
          "apiBaseUrl",
          "labels",
          "advertisedBrickIds",
          "drained",
          "name",
          "maxConcurrency",
          "cpuCount",
          "memoryMb",
        ]);
        const peerId = field.string(body, "peerId");
        if (!peerId) throw invalid("peerId is required");
        const { worker } = await s.fleet.registerWorker({
          peerId,
          name: field.string(body, "name") ?? peerId,
          apiBaseUrl: field.string(body, "apiBaseUrl") ?? "",
          labels: field.stringMap(body, "labels") ?? {},
          capabilities: field.strings(body, "advertisedBrickIds") ?? [],
          // A node that states no maxConcurrency is placed greedily, with no
          // slot limit, as the director contract places (0: no limit).
          maxConcurrency: field.int(body, "maxConcurrency") ?? 0,
          cpuCount: field.int(body, "cpuCount") ?? 0,
          memoryMb: BigInt(field.int(body, "memoryMb") ?? 0),
        });
        if (!worker) throw new Error("RegisterWorker returned no worker");
        const drained = field.bool(body, "drained");
        if (drained === undefined || drained === worker.drained) return [200, nodeJson(worker)];
        const after = await s.fleet.drainWorker({ workerId: worker.workerId, drained });
        return [200, nodeJson(after.worker ?? worker)];
      },
    ),

    route(
      ["GET"],
      "/fleet/nodes/{id}",
      ["FleetService/GetWorker"],
      "read a fleet node",
      async (s, _req, match) => [200, nodeJson(await s.workerOf(peerIdOf(match)))],
    ),

    route(
      ["DELETE"],
      "/fleet/nodes/{id}",
      ["FleetService/DeregisterWorker"],
      "remove a fleet node",
      async (s, _req, match) => {
        const worker = await s.workerOf(peerIdOf(match));
        const { releasedTaskIds } = await s.fleet.deregisterWorker({ workerId: worker.workerId });
        return [200, { peerId: worker.peerId || worker.workerId, releasedTaskIds }];
      },
    ),

    route(
      ["POST"],
      "/fleet/nodes/{id}/heartbeat",
      ["FleetService/Heartbeat"],
      "heartbeat for a fleet node",
      async (s, _req, match) => {
        const body = await s.json(["queueDepth"], { optional: true });
        const worker = await s.workerOf(peerIdOf(match));
        const beat = await s.fleet.heartbeat({
          workerId: worker.workerId,
          queueDepth: field.int(body, "queueDepth"),
        });
        return [
          200,
          {
            peerId: worker.peerId || worker.workerId,
            drained: beat.drained,
            heartbeatIntervalSeconds: beat.heartbeatIntervalSeconds,
          },
        ];
      },
    ),

    route(
      ["POST"],
      "/fleet/nodes/{id}/drain",
      ["FleetService/DrainWorker"],
      "drain a fleet node",
      async (s, _req, match) => {
        const body = await s.json(["drained"], { optional: true });
        const worker = await s.workerOf(peerIdOf(match));
        const { worker: after } = await s.fleet.drainWorker({
          workerId: worker.workerId,
          drained: field.bool(body, "drained") ?? true,
        });
        return [200, nodeJson(after ?? worker)];
      },
    ),

    route(
      ["GET"],
      "/elastic/status",
      ["FleetService/GetFleetStatus"],
      "read the fleet status",
      async (s) => {
        const status = await s.fleet.getFleetStatus({});
        const taskCounts: Record<string, number> = {};
        for (const c of status.taskCounts) {
          const name = statusName[c.state];
          if (name) taskCounts[name] = Number(c.count);
        }
        return [
          200,
          {
            taskCounts,
            backlog: status.backlog.map((b) => ({
              workload: b.workload,
              pendingCount: Number(b.pendingCount),
              oldestCreatedUtc: iso(b.oldestCreatedAt),
              oldestAgeSeconds: b.oldestAge ? Number(b.oldestAge.seconds) : 0,
            })),
            workers: status.workers.map((w) => ({
              peerId: w.peerId || w.workerId,
              workerId: w.workerId,
              name: w.name,
              state: w.state === WorkerState.LOST ? "Lost" : "Active",
              drained: w.drained,
              queueDepth: w.queueDepth,
              activeLeases: w.activeLeases,
              // null for a node without a slot limit (maxConcurrency 0 in the RPCs).
              maxConcurrency: w.maxConcurrency === 0 ? null : w.maxConcurrency,
              freeSlots: w.maxConcurrency === 0 ? null : w.freeSlots,
            })),
          },
        ];
      },
    ),

    route(["GET"], "/tasks", ["TaskService/ListTasks"], "list tasks", async (s, req) => {
      const query = new URL(req.url ?? "/", "http://x").searchParams;
      const status = query.get("status");
      const state = status ? stateOfStatus(status) : TaskState.UNSPECIFIED;
      const pageSizeText = query.get("pageSize");
      const page = await s.tasks.listTasks({
        state,
        workload: query.get("workload") ?? "",
        correlationId: query.get("correlationId") ?? "",
        // 0 would mean "the default" to the RPC: here it is out of range, as documented.
        pageSize: pageSizeText === null ? 0 : queryInt("pageSize", pageSizeText, 1),
        pageToken: query.get("pageToken") ?? "",
      });
      return [
        200,
        {
          tasks: await Promise.all(page.tasks.map(s.taskJson)),
          nextPageToken: orNull(page.nextPageToken),
        },
      ];
    }),

    route(["POST"], "/tasks", ["TaskService/CreateTask"], "create a task", async (s, _req) => {
      const body = await s.json(taskFields);
      const required = field.strings(body, "requiredBrickIds") ?? [];
      const workload = field.string(body, "workload") ?? required[0];
      if (!workload) throw invalid("requiredBrickIds (or workload) must name what runs the task");
      const deadline = field.time(body, "deadlineUtc");
      const inputArtifactId = field.string(body, "inputArtifactId");
      const { task } = await s.tasks.createTask({
        name: field.string(body, "name") ?? "",
        workload,
        requiredCapabilities: required,
        affinity: field.stringMap(body, "affinity") ?? {},
        priority: field.int(body, "priority") ?? 0,
        deadline: deadline && timestampFromDate(deadline),
        parameters: field.object(body, "parameters") as JsonObject | undefined,
        steps: field.int(body, "steps"),
        maxAttempts: field.int(body, "maxAttempts"),
        leaseSeconds: field.int(body, "leaseSeconds"),
        idempotencyKey: field.string(body, "idempotencyKey") ?? "",
        correlationId: field.string(body, "correlationId") ?? "",
        input: inputArtifactId
          ? { case: "inputArtifactId", value: inputArtifactId }
          : { case: undefined },
      });
      return [200, await s.taskJson(required0(task))];
    }),

    route(["GET"], "/tasks/{id}", ["TaskService/GetTask"], "read a task", async (s, _req, m) => {
      const { task } = await s.tasks.getTask({ taskId: m[1] ?? "" });
      return [200, await s.taskJson(required0(task))];
    }),

    ...(["schedule", "retry"] as const).map((op) =>
      route(
        ["POST"],
        `/tasks/{id}/${op}`,
        [op === "schedule" ? "TaskService/ScheduleTask" : "TaskService/RetryTask"],
        `${op} a task`,
        async (s, _req, m) => {
          const body = await s.json(placementFields, { optional: true });
          const placement = {
            taskId: m[1] ?? "",
            scheduleIdempotencyKey: field.string(body, "scheduleIdempotencyKey") ?? "",
            correlationId: field.string(body, "correlationId") ?? "",
            leaseSeconds: field.int(body, "leaseSeconds"),
          };
          const { task } =
            op === "schedule"
              ? await s.tasks.scheduleTask(placement)
              : await s.tasks.retryTask(placement);
          return [200, await s.taskJson(required0(task))];
        },
      ),
    ),

    route(
      ["POST"],
      "/tasks/{id}/lease/extend",
      ["LeaseService/RenewLease"],
      "extend a lease",
      async (s, _req, m) => {
        const body = await s.json(["leaseToken", "extendSeconds"]);
        const lease = await leaseRef(m[1] ?? "", field.string(body, "leaseToken"));
        const renewed = await s.leases.renewLease({
          ...lease,
          extendSeconds: field.int(body, "extendSeconds"),
        });
        // The holder proved the lease: it may see the task it holds (even
        // with a worker token, which may not call GetTask).
        const task = await deps.readTask(lease.taskId);
        return [
          200,
          {
            ...(await s.taskJson(task)),
            leaseToken: lease.leaseToken,
            leaseExpiresUtc: iso(renewed.leaseExpiresAt),
          },
        ];
      },
    ),

    route(
      ["POST"],
      "/tasks/{id}/migrate-for-checkpoint",
      ["LeaseService/ReleaseTask"],
      "release a task with a checkpoint",
      async (s, _req, m) => {
        const body = await s.json(["leaseToken", "checkpointHandle"]);
        const lease = await leaseRef(m[1] ?? "", field.string(body, "leaseToken"));
        const { task } = await s.leases.releaseTask({
          ...lease,
          checkpointHandle: field.string(body, "checkpointHandle") ?? "",
        });
        return [200, await s.taskJson(required0(task))];
      },
    ),

    route(
      ["PATCH"],
      "/tasks/{id}/status",
      [
        "LeaseService/StartTask",
        "LeaseService/CompleteTask",
        "LeaseService/FailTask",
        "LeaseService/ReleaseTask",
      ],
      "report a task's status",
      async (s, _req, m) => {
        const body = await s.json([
          "status",
          "leaseToken",
          "resultSummary",
          "resultHandle",
          "errorCode",
          "checkpointHandle",
        ]);
        const status = field.string(body, "status");
        const to = status === undefined ? undefined : reportable[status.toLowerCase()];
        if (to === undefined) {
          throw invalid("status must be Running, Succeeded, Failed or Pending");
        }
        const handle = field.string(body, "resultHandle");
        if (handle !== undefined && to !== TaskState.SUCCEEDED) {
          throw invalid("resultHandle is taken only with status Succeeded");
        }
        const result = handle === undefined ? undefined : await resultOf(s, handle);
        const lease = await leaseRef(m[1] ?? "", field.string(body, "leaseToken"));
        const summary = field.string(body, "resultSummary") ?? "";
        let task: Task | undefined;
        if (to === TaskState.RUNNING) {
          ({ task } = await s.leases.startTask(lease));
        } else if (to === TaskState.SUCCEEDED) {
          ({ task } = await s.leases.completeTask({ ...lease, result, resultSummary: summary }));
        } else if (to === TaskState.FAILED) {
          // A director retries a failed task itself (POST .../retry).
          ({ task } = await s.leases.failTask({
            ...lease,
            errorCode: field.string(body, "errorCode") ?? "Failed",
            errorMessage: summary,
            retryable: false,
          }));
        } else {
          ({ task } = await s.leases.releaseTask({
            ...lease,
            checkpointHandle: field.string(body, "checkpointHandle") ?? "",
          }));
        }
        return [200, await s.taskJson(required0(task))];
      },
    ),

    route(
      ["GET"],
      "/knowledge/export",
      ["KnowledgeService/ExportKnowledge"],
      "export knowledge",
      async (s, req) => {
        const query = new URL(req.url ?? "/", "http://x").searchParams;
        const sinceText = query.get("since");
        const since = sinceText === null ? undefined : parseTime(sinceText);
        if (sinceText !== null && !since) throw invalid("since must be an RFC 3339 time");
        const groups: Record<string, unknown[]> = { adaptations: [], patterns: [] };
        for await (const page of s.knowledge.exportKnowledge({
          kind: query.get("kind") ?? "",
          since: since && timestampFromDate(since),
        })) {
          for (const e of page.entries) {
            const group = `${e.kind}s`;
            groups[group] ??= [];
            groups[group].push({
              kind: e.kind,
              key: e.key,
              value: e.value ?? {},
              version: Number(e.version),
              updatedAt: iso(e.updatedAt),
              origin: e.origin,
            });
          }
        }
        return [200, groups];
      },
    ),

    route(
      ["POST"],
      "/knowledge/import",
      ["KnowledgeService/ImportKnowledge"],
      "import knowledge",
      async (s, _req) => {
        const body = await s.json("any");
        return [200, await importKnowledge(s, body)];
      },
    ),
  ];
}

/** A `status` query value (a director status name, any case) as a task state. */
function stateOfStatus(status: string): TaskState {
  for (const [state, name] of Object.entries(statusName)) {
    if (name && name.toLowerCase() === status.toLowerCase()) return Number(state) as TaskState;
  }
  throw invalid(`status must be one of Pending, Assigned, Running, Succeeded, Failed, Canceled`);
}

function queryInt(name: string, text: string, min: number): number {
  if (!/^\d{1,9}$/.test(text) || Number(text) < min) {
    throw invalid(`${name} must be a whole number, at least ${min}`);
  }
  return Number(text);
}

/** The task of a response that always has one. */
function required0(task: Task | undefined): Task {
  if (!task) throw new Error("the response holds no task");
  return task;
}

const artifactPath = /^\/artifacts\/([0-9a-fA-F-]{36})\/download$/;

/**
 * The result a `resultHandle` names: an artifact id, or an artifact's uri
 * (its download URL). Anything else, a host file path above all, is
 * refused and never read.
 */
async function resultOf(s: Session, handle: string) {
  let artifactId = handle;
  let uri: string | undefined;
  if (!isUuid(handle)) {
    let url: URL | undefined;
    try {
      url = new URL(handle);
    } catch {
      url = undefined;
    }
    const id =
      url && /^https?:$/.test(url.protocol) ? artifactPath.exec(url.pathname)?.[1] : undefined;
    if (!id || !isUuid(id)) {
      throw invalid(
        "resultHandle must name an artifact stored by this coordinator (its artifact id or uri); a file path is never read",
      );
    }
    artifactId = id;
    uri = handle;
  }
  const { artifact } = await s.artifacts.getArtifact({ artifactId });
  if (!artifact) throw new Error("GetArtifact returned no artifact");
  return {
    artifactId: artifact.artifactId,
    uri: uri ?? artifact.uri,
    sha256: artifact.sha256,
    contentType: artifact.contentType,
  };
}

/**
 * A placement refused because the task is assigned under another key
 * (`aborted` carrying the task): 409 with the current task as the body, as
 * the director contract has it, plus `error`, `message` and `reason`.
 */
async function sentAsConflictWithTask(s: Session, res: Response, error: unknown): Promise<boolean> {
  if (!(error instanceof ConnectError) || error.code !== Code.Aborted) return false;
  const [task] = error.findDetails(TaskSchema);
  if (!task) return false;
  const answer = refusalJson(error);
  sendJson(res, answer.status, { ...(await s.taskJson(task)), ...answer.body });
  return true;
}

/** Knowledge groups are named after their kind: `adaptation` → `adaptations`. */
const kindOfGroup = (group: string) => (group.endsWith("s") ? group.slice(0, -1) : group);

/**
 * Imports `{"adaptations": [...], "patterns": [...], "<kind>s": [...]}`:
 * every entry goes to ImportKnowledge, which merges them and says why it
 * rejects any; an entry JSON cannot turn into a KnowledgeEntry is rejected
 * here with its reason. Rejections name the group and the index in it.
 */
async function importKnowledge(s: Session, body: JsonBody) {
  const entries: KnowledgeEntry[] = [];
  const origins: { group: string; index: number }[] = [];
  const rejections: { group: string; index: number; key: string; reason: string }[] = [];
  let rejected = 0;
  const reject = (group: string, index: number, key: string, reason: string) => {
    rejected++;
    if (rejections.length < 100) rejections.push({ group, index, key, reason });
  };
  for (const [group, list] of Object.entries(body)) {
    if (!Array.isArray(list)) throw invalid(`${group.slice(0, 64)} must be a list of entries`);
    list.forEach((item: unknown, index) => {
      const e = item as JsonBody;
      const key = typeof e?.key === "string" ? e.key : "";
      try {
        if (typeof item !== "object" || item === null || Array.isArray(item)) {
          throw invalid("an entry must be a JSON object");
        }
        const kind = field.string(e, "kind") ?? kindOfGroup(group);
        if (kind !== kindOfGroup(group)) throw invalid(`kind ${kind} does not belong in ${group}`);
        const version = e.version;
        if (
          version !== undefined &&
          (typeof version !== "number" || !Number.isSafeInteger(version))
        ) {
          throw invalid("version must be a whole number");
        }
        const updatedAt = field.time(e, "updatedAt");
        entries.push(
          create(KnowledgeEntrySchema, {
            kind,
            key: field.string(e, "key") ?? "",
            value: (field.object(e, "value") ?? {}) as JsonObject,
            version: BigInt(version ?? 0),
            updatedAt: updatedAt && timestampFromDate(updatedAt),
            origin: field.string(e, "origin") ?? "",
          }),
        );
        origins.push({ group, index });
      } catch (error) {
        if (!(error instanceof DomainError)) throw error;
        reject(group, index, key, error.message);
      }
    });
  }
  const counts = await s.knowledge.importKnowledge({ entries });
  for (const r of counts.rejections) {
    const from = origins[r.index];
    if (from) reject(from.group, from.index, r.key, r.reason);
  }
  rejected += Number(counts.rejected) - counts.rejections.length;
  return {
    inserted: Number(counts.inserted),
    updated: Number(counts.updated),
    unchanged: Number(counts.unchanged),
    rejected,
    rejections: rejections.sort((a, b) =>
      a.group === b.group ? a.index - b.index : a.group < b.group ? -1 : 1,
    ),
  };
}

/** The peer id in a route's path, percent-decoded. */
function peerIdOf(match: RegExpExecArray): string {
  try {
    return decodeURIComponent(match[1] ?? "");
  } catch {
    throw invalid("the peer id in the path is not valid percent-encoding");
  }
}
