import { type Timestamp, timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { ArtifactService } from "../../../gen/meshwork/v1/artifact_pb.js";
import { FleetService, type Worker } from "../../../gen/meshwork/v1/fleet_pb.js";
import { KnowledgeService } from "../../../gen/meshwork/v1/knowledge_pb.js";
import { LeaseService } from "../../../gen/meshwork/v1/lease_pb.js";
import {
  DependencyPolicy,
  type LabelRequirement,
  type Task,
  TaskSchema,
  TaskService,
  TaskState,
} from "../../../gen/meshwork/v1/task_pb.js";
import { sendJson } from "../../http/json.js";
import { refusalJson } from "../../http/refusal-json.js";
import type { PlainRoute, Request, Response } from "../../http/routes.js";
import { operatorName, readJson } from "../body.js";
import type { CallerOf, InProcessCaller } from "../in-process.js";
import { restRoute } from "../route.js";

export interface DirectorDeps {
  call: InProcessCaller;
  maxBodyBytes: number;
}

/** A task state as the director contract spells it. */
export const statusName: Record<TaskState, string | null> = {
  [TaskState.UNSPECIFIED]: null,
  [TaskState.PENDING]: "Pending",
  [TaskState.ASSIGNED]: "Assigned",
  [TaskState.RUNNING]: "Running",
  [TaskState.SUCCEEDED]: "Succeeded",
  [TaskState.FAILED]: "Failed",
  [TaskState.CANCELED]: "Canceled",
};

/** A dependency policy as the director contract spells it. */
export const policyName: Record<DependencyPolicy, string> = {
  [DependencyPolicy.UNSPECIFIED]: "AllSucceeded",
  [DependencyPolicy.ALL_SUCCEEDED]: "AllSucceeded",
  [DependencyPolicy.ALL_DONE]: "AllDone",
};

/** A map<string, int64> as JSON numbers. */
export const numbers = (map: Record<string, bigint>): Record<string, number> =>
  Object.fromEntries(Object.entries(map).map(([k, v]) => [k, Number(v)]));

/** A label requirement as the REST contracts write it (Kubernetes' operator names). */
export const requirementJson = (r: LabelRequirement) => ({
  key: r.key,
  operator: operatorName(r.operator),
  values: r.values,
});

export const iso = (t: Timestamp | undefined): string | null =>
  t ? timestampDate(t).toISOString() : null;
export const orNull = (s: string): string | null => (s === "" ? null : s);

/** One request's view of the RPCs, with a cache of worker id → peer id. */
function session(deps: DirectorDeps, caller: CallerOf, body: AsyncIterable<Uint8Array>) {
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
      resources: numbers(t.resources),
      requirements: t.requirements.map(requirementJson),
      preferences: t.preferences.map((p) => ({
        weight: p.weight,
        requirement: p.requirement ? requirementJson(p.requirement) : null,
      })),
      share: t.share,
      concurrencyKey: orNull(t.concurrencyKey),
      rateKey: orNull(t.rateKey),
      // Workflows (docs/workflows.md): when it may start, what it waits for, its bound, its value.
      ref: orNull(t.ref),
      runAtUtc: iso(t.runAt),
      dependsOn: t.dependsOn,
      dependencyPolicy: policyName[t.dependencyPolicy],
      dependenciesPending: t.dependenciesPending,
      dependencyOutputs: t.dependencyOutputs,
      timeoutSeconds: t.timeoutSeconds === 0 ? null : t.timeoutSeconds,
      resultValue: t.resultValue ?? null,
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

export type Session = ReturnType<typeof session>;

/**
 * One route of the director contract: its path under `/api/mesh` (`{id}`: a
 * path segment), its RPCs, and a handler answering [status, JSON body].
 */
export type DirectorRoute = (
  methods: string[],
  path: string,
  rpcs: string[],
  what: string,
  handle: (s: Session, req: Request, match: RegExpExecArray) => Promise<[number, unknown]>,
) => PlainRoute;

/**
 * The director's routes over the RPCs (route.ts, restRoute): each answers
 * with its `X-Ashlar-Correlation-Id`, and a placement conflict that carries
 * the task is answered with it (sentAsConflictWithTask).
 */
export function directorRoute(deps: DirectorDeps): DirectorRoute {
  return (methods, path, rpcs, what, handle) =>
    restRoute(
      methods,
      new RegExp(`^/api/mesh${path.replaceAll("{id}", "([^/]+)")}$`),
      rpcs,
      what,
      async ({ req, res, match, body, caller }) => {
        res.setHeader("x-ashlar-correlation-id", caller.correlation.id);
        const s = session(deps, caller, body);
        try {
          const [status, answer] = await handle(s, req, match);
          sendJson(res, status, answer);
        } catch (error) {
          if (await sentAsConflictWithTask(s, res, error)) return;
          throw error;
        }
      },
    );
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

/** The task of a response that always has one. */
export function required0(task: Task | undefined): Task {
  if (!task) throw new Error("the response holds no task");
  return task;
}
