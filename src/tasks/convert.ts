import { create } from "@bufbuild/protobuf";
import type { Duration, Timestamp } from "@bufbuild/protobuf/wkt";
import { durationMs, timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ArtifactRef } from "../../gen/meshwork/v1/artifact_pb.js";
import {
  type CreateTaskRequest,
  type Delivery,
  DeliveryState,
  DependencyPolicy,
  type LabelRequirement,
  Operator,
  type Task,
  type TaskEvent,
  TaskEventSchema,
  TaskState,
} from "../../gen/meshwork/v1/task_pb.js";
import { invalid } from "../core/errors.js";
import {
  entryCount,
  limitKey,
  type OperatorName,
  preference,
  requirement,
  sharePath,
  taskResources,
} from "../core/scheduling.js";
import {
  intInRange,
  isStorableTime,
  shallowJson,
  stringList,
  stringMap,
  text,
} from "../core/validate.js";
import type {
  ArtifactRefJson,
  DeliveryRow,
  RequirementJson,
  Resources,
  TaskEventRow,
  TaskRow,
  TaskStateName,
} from "../db/schema/index.js";
import { workflowOf } from "./dependencies.js";
import type { NewTask } from "./store.js";

export const defaults = {
  maxAttempts: 3,
  leaseSeconds: 60,
  backoff: { initialMs: 1000, maxMs: 5 * 60_000, multiplier: 2 },
} as const;

export function toTaskState(name: TaskStateName): TaskState {
  return TaskState[name];
}

/** The state a filter names, or undefined for UNSPECIFIED. */
export function fromTaskState(state: TaskState): TaskStateName | undefined {
  if (state === TaskState.UNSPECIFIED) return undefined;
  const name = TaskState[state] as TaskStateName | undefined;
  if (name === undefined) throw invalid(`state ${state} is not a task state`);
  return name;
}

export function toArtifactRef(ref: ArtifactRefJson | null): ArtifactRef | undefined {
  if (!ref) return undefined;
  // Stored JSON, not checked by the compiler: a missing text is empty, as create() made it.
  return {
    $typeName: "meshwork.v1.ArtifactRef",
    artifactId: ref.artifactId ?? "",
    uri: ref.uri ?? "",
    sha256: ref.sha256 ?? "",
    sizeBytes: BigInt(ref.sizeBytes),
    contentType: ref.contentType ?? "",
  };
}

// The answers that carry tasks build their messages as object literals,
// typed as the generated message types (so that a field added to the proto
// is a type error here until it is filled), rather than through `create()`
// and the wkt helpers: for a CreateTasks of 1,000 that took 5.3 ms of the
// coordinator's CPU, the literals 0.55 ms, with the same bytes on the wire.

/** A time as a google.protobuf.Timestamp (as `timestampFromDate` makes it). */
export function timestamp(d: Date): Timestamp {
  const ms = d.getTime();
  const seconds = Math.floor(ms / 1000);
  return {
    $typeName: "google.protobuf.Timestamp",
    seconds: BigInt(seconds),
    nanos: (ms - seconds * 1000) * 1_000_000,
  };
}

const ts = (d: Date | null): Timestamp | undefined => (d ? timestamp(d) : undefined);

/** Milliseconds as a google.protobuf.Duration (as `durationFromMs` makes it). */
function duration(ms: number): Duration {
  const sign = ms < 0 ? -1 : 1;
  const abs = Math.abs(ms);
  const seconds = Math.floor(abs / 1000);
  const nanos = (abs - seconds * 1000) * 1_000_000;
  return {
    $typeName: "google.protobuf.Duration",
    seconds: BigInt(seconds * sign),
    // No signed zero: it would not serialize.
    nanos: nanos === 0 ? 0 : nanos * sign,
  };
}

/**
 * When a task's last lease stopped holding, or null while it is live
 * (ASSIGNED or RUNNING, not yet run out): the earliest of its expiry and
 * the change that ended it (finished_at for a terminal task, else the last
 * update, which put it back to PENDING).
 */
export function leaseEndedAt(
  row: Pick<TaskRow, "state" | "leaseExpiresAt" | "finishedAt" | "updatedAt">,
  now = new Date(),
): Date | null {
  const expires = row.leaseExpiresAt;
  const held = row.state === "ASSIGNED" || row.state === "RUNNING";
  if (held) return expires && expires <= now ? expires : null;
  const change = row.finishedAt ?? row.updatedAt;
  return expires && expires < change ? expires : change;
}

/**
 * The public form of a task. The lease token is included only when
 * `withToken` (the response that grants the lease); reads never show it.
 */
/**
 * A task as the wire has it. `outputs` are its dependency_outputs
 * (tasks/outputs.ts), for the reads that look them up.
 */
export function toTask(
  row: TaskRow,
  withToken = false,
  outputs: Record<string, string> = {},
  delivery?: DeliveryRow,
): Task {
  return {
    $typeName: "meshwork.v1.Task",
    taskId: row.id,
    name: row.name,
    workload: row.workload,
    requiredCapabilities: row.requiredCapabilities,
    affinity: row.affinity,
    priority: row.priority,
    deadline: ts(row.deadline),
    parameters: (row.parameters ?? undefined) as Task["parameters"],
    input: toArtifactRef(row.input),
    steps: row.steps ?? undefined,
    state: toTaskState(row.state),
    attempt: row.attempt,
    maxAttempts: row.maxAttempts,
    leaseSeconds: row.leaseSeconds,
    retryBackoff: {
      $typeName: "meshwork.v1.RetryBackoff",
      initial: duration(row.backoffInitialMs),
      max: duration(row.backoffMaxMs),
      multiplier: row.backoffMultiplier,
    },
    idempotencyKey: row.idempotencyKey ?? "",
    correlationId: row.correlationId,
    traceparent: row.traceParent,
    tracestate: row.traceState,
    assignedWorkerId: row.assignedWorkerId ?? "",
    assignedApiBaseUrl: row.assignedApiBaseUrl,
    lease: row.leaseWorkerId
      ? {
          $typeName: "meshwork.v1.Lease",
          workerId: row.leaseWorkerId,
          attempt: row.attempt,
          leaseToken: withToken ? (row.leaseToken ?? "") : "",
          expiresAt: ts(row.leaseExpiresAt),
          endedAt: ts(leaseEndedAt(row)),
        }
      : undefined,
    checkpointHandle: row.checkpointHandle,
    progress: {
      $typeName: "meshwork.v1.Progress",
      completedSteps: row.progressSteps,
      message: row.progressMessage,
    },
    result: toArtifactRef(row.result),
    resultSummary: row.resultSummary,
    metrics: row.metrics,
    error: row.errorCode
      ? { $typeName: "meshwork.v1.TaskError", code: row.errorCode, message: row.errorMessage }
      : undefined,
    cancelRequested: row.cancelRequested,
    createdAt: ts(row.createdAt),
    updatedAt: ts(row.updatedAt),
    startedAt: ts(row.startedAt),
    finishedAt: ts(row.finishedAt),
    resources: toQuantities(row.resources),
    requirements: row.requirements.map(toRequirement),
    preferences: row.preferences.map((p) => ({
      $typeName: "meshwork.v1.WeightedRequirement",
      weight: p.weight,
      requirement: toRequirement(p),
    })),
    share: row.share,
    concurrencyKey: row.concurrencyKey,
    rateKey: row.rateKey,
    scheduleId: row.scheduleId ?? "",
    ref: row.ref,
    dependsOn: row.dependsOn,
    dependencyPolicy:
      row.dependencyPolicy === "ALL_DONE"
        ? DependencyPolicy.ALL_DONE
        : DependencyPolicy.ALL_SUCCEEDED,
    dependencyOutputs: outputs,
    dependenciesPending: row.dependenciesPending,
    timeoutSeconds: row.timeoutSeconds ?? 0,
    resultValue: (row.resultValue ?? undefined) as Task["resultValue"],
    // While dependencies wait, not_before is 'infinity': no time to show.
    notBefore:
      row.notBefore && Number.isFinite(row.notBefore.getTime()) ? ts(row.notBefore) : undefined,
    runAt: ts(row.runAt),
    dispatch: row.dispatch,
    delivery: delivery && toDelivery(delivery),
  };
}

/** The delivery of a pushed attempt (fleet/dispatch.ts), as Task.delivery shows it. */
export function toDelivery(d: DeliveryRow): Delivery {
  return {
    $typeName: "meshwork.v1.Delivery",
    state: DeliveryState[d.state],
    workerId: d.workerId,
    attempt: d.attempt,
    tries: d.tries,
    lastStatus: d.lastStatus,
    lastError: d.lastError,
    lastAt: ts(d.lastAt),
    nextAt: d.state === "DELIVERING" ? ts(d.nextAt) : undefined,
  };
}

/** A stored resource map as protobuf's map<string, int64>. */
export function toQuantities(map: Resources): Record<string, bigint> {
  return Object.fromEntries(Object.entries(map).map(([k, v]) => [k, BigInt(v)]));
}

function validTimestamp(field: string, t: Timestamp): Date {
  const d = timestampDate(t);
  if (!isStorableTime(d) || t.nanos < 0 || t.nanos > 999_999_999) {
    throw invalid(`${field} is not a valid time`);
  }
  return d;
}

/**
 * What a create request brings besides its body: its correlation id, W3C
 * trace context, and the share its tasks go to unless they name one.
 */
export interface CreateOrigin {
  correlationId: string;
  /** The default share path (the caller's token name, or --default-share). */
  share: string;
  /** The `traceparent` to store (tracing/context.ts traceparentOf), "" for none. */
  traceparent: string;
  tracestate: string;
  /** Whether a task that does not say is delivered by the coordinator (--dispatch-default). */
  dispatch?: boolean;
  /** Workloads whose tasks that do not say are delivered (--dispatch-workloads). */
  dispatchWorkloads?: readonly string[];
}

/** Validates and defaults a CreateTaskRequest. `field` prefixes messages (e.g. "tasks[3].") in batches. */
export function fromCreateRequest(
  req: CreateTaskRequest,
  origin: CreateOrigin,
  field = "",
): NewTask {
  const b = req.retryBackoff;
  const backoff = {
    initialMs: b?.initial ? durationMs(b.initial) : defaults.backoff.initialMs,
    maxMs: b?.max ? durationMs(b.max) : defaults.backoff.maxMs,
    multiplier: b && b.multiplier !== 0 ? b.multiplier : defaults.backoff.multiplier,
  };
  const day = 86_400_000;
  if (!Number.isInteger(backoff.initialMs) || backoff.initialMs < 0 || backoff.initialMs > day) {
    throw invalid(`${field}retry_backoff.initial must be from 0 to 24h`);
  }
  if (
    !Number.isInteger(backoff.maxMs) ||
    backoff.maxMs < backoff.initialMs ||
    backoff.maxMs > day
  ) {
    throw invalid(`${field}retry_backoff.max must be from retry_backoff.initial to 24h`);
  }
  if (!(backoff.multiplier >= 1 && backoff.multiplier <= 100)) {
    throw invalid(`${field}retry_backoff.multiplier must be from 1 to 100`);
  }
  return {
    name: text(`${field}name`, req.name, { optional: true }),
    workload: text(`${field}workload`, req.workload),
    requiredCapabilities: stringList(`${field}required_capabilities`, req.requiredCapabilities),
    affinity: stringMap(`${field}affinity`, req.affinity),
    priority: req.priority,
    deadline: req.deadline ? validTimestamp(`${field}deadline`, req.deadline) : null,
    parameters:
      shallowJson(`${field}parameters`, req.parameters as Record<string, unknown> | undefined) ??
      null,
    steps:
      req.steps === undefined ? null : intInRange(`${field}steps`, req.steps, 0, 1_000_000_000),
    maxAttempts:
      req.maxAttempts === undefined
        ? defaults.maxAttempts
        : intInRange(`${field}max_attempts`, req.maxAttempts, 1, 100),
    leaseSeconds:
      req.leaseSeconds === undefined
        ? defaults.leaseSeconds
        : intInRange(`${field}lease_seconds`, req.leaseSeconds, 5, 86_400),
    backoff,
    idempotencyKey:
      req.idempotencyKey === "" ? null : text(`${field}idempotency_key`, req.idempotencyKey),
    input: null,
    correlationId: text(`${field}correlation_id`, req.correlationId || origin.correlationId, {
      optional: true,
    }),
    traceParent: origin.traceparent,
    traceState: origin.tracestate,
    dispatch:
      req.dispatch ??
      (origin.dispatch === true || (origin.dispatchWorkloads ?? []).includes(req.workload)),
    ...schedulingOf(req, origin, field),
    ...workflowOf(req, field),
  };
}

/** Each operator's enum value, by its stored name. */
const operatorOf: Record<OperatorName, Operator> = {
  In: Operator.IN,
  NotIn: Operator.NOT_IN,
  Exists: Operator.EXISTS,
  DoesNotExist: Operator.DOES_NOT_EXIST,
  Gt: Operator.GT,
  Lt: Operator.LT,
};
const operatorNames = new Map(
  Object.entries(operatorOf).map(([name, op]) => [op, name as OperatorName]),
);

/** An operator's stored name (`In`, `NotIn`, …), undefined for UNSPECIFIED or an unknown value. */
export function operatorName(op: Operator): OperatorName | undefined {
  return operatorNames.get(op);
}

/** A LabelRequirement as stored, checked. */
export function fromRequirement(field: string, r: LabelRequirement | undefined): RequirementJson {
  return requirement(field, r?.key ?? "", operatorName(r?.operator ?? Operator.UNSPECIFIED), [
    ...(r?.values ?? []),
  ]);
}

/** A stored requirement as a LabelRequirement. */
export function toRequirement(r: RequirementJson): LabelRequirement {
  return {
    $typeName: "meshwork.v1.LabelRequirement",
    key: r.key,
    operator: operatorOf[r.op],
    values: r.values,
  };
}

/** The scheduling fields of a create request (docs/scheduling.md), checked. */
function schedulingOf(req: CreateTaskRequest, origin: CreateOrigin, field: string) {
  entryCount(`${field}requirements`, req.requirements.length);
  entryCount(`${field}preferences`, req.preferences.length);
  return {
    resources: taskResources(`${field}resources`, req.resources),
    requirements: req.requirements.map((r, i) => fromRequirement(`${field}requirements[${i}]`, r)),
    preferences: req.preferences.map((p, i) =>
      preference(
        `${field}preferences[${i}]`,
        p.weight,
        fromRequirement(`${field}preferences[${i}].requirement`, p.requirement),
      ),
    ),
    share: req.share === "" ? origin.share : sharePath(`${field}share`, req.share),
    shareGiven: req.share !== "",
    concurrencyKey: limitKey(`${field}concurrency_key`, req.concurrencyKey),
    rateKey: limitKey(`${field}rate_key`, req.rateKey),
  };
}

/** One event of a task's history, as ListTaskEvents answers it. */
export function toTaskEvent(row: TaskEventRow): TaskEvent {
  return create(TaskEventSchema, {
    sequence: BigInt(row.id),
    time: timestampFromDate(row.at),
    state: toTaskState(row.state),
    attempt: row.attempt,
    workerId: row.workerId ?? "",
    errorCode: row.errorCode,
    errorMessage: row.errorMessage,
    kind: row.kind,
    dispatch:
      row.kind === "dispatch" && row.detail
        ? {
            outcome: String(row.detail.outcome ?? ""),
            httpStatus: Number(row.detail.httpStatus ?? 0),
            durationMs: Number(row.detail.durationMs ?? 0),
            url: String(row.detail.url ?? ""),
            error: String(row.detail.error ?? ""),
          }
        : undefined,
  });
}
