import { create, type JsonObject, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ArtifactRef } from "../../gen/meshwork/v1/artifact_pb.js";
import {
  type CreateTaskRequest,
  CreateTaskRequestSchema,
  DependencyPolicy,
  type LabelRequirementSchema,
  type Task,
  type TaskFilter,
  TaskFilterSchema,
  TaskState,
  type WeightedRequirementSchema,
} from "../../gen/meshwork/v1/task_pb.js";

// The client's plain options → the protobuf requests, and the tasks back.

/** A task state by its enum value or its name (`"FAILED"`, …). */
export type StateLike = TaskState | keyof typeof TaskState;

/** How to create one task: everything of CreateTaskRequest but the workload and parameters. */
export interface TaskOptions {
  /** A human-readable label (≤ 256 characters). */
  name?: string;
  /**
   * Makes the create safe to repeat: the same key and request return the
   * existing task. By default the client makes a random key per create call
   * and reuses it for its own retries, so a retried create never makes a
   * second task. Pass your own to make a create idempotent across processes
   * (e.g. an order id), or `false` to send none.
   */
  idempotencyKey?: string | false;
  /** Claims take higher priorities first (default 0). */
  priority?: number;
  /** Attempts that may fail before the task is FAILED (1–100, default 3). */
  maxAttempts?: number;
  /** The TTL of one lease, in seconds (5–86400, default 60). */
  leaseSeconds?: number;
  /** The wait between a failed attempt and the next. */
  retryBackoff?: { initialMs?: number; maxMs?: number; multiplier?: number };
  /** Bounds one attempt's running time across renewals (1–604800 s); past it the attempt fails with TIMEOUT. */
  timeoutSeconds?: number;
  /** Fails the task if it is still PENDING at this time (DEADLINE_EXCEEDED). */
  deadline?: Date;
  /** Holds the task back until this time (at most a year ahead). Not with `delaySeconds`. */
  runAt?: Date;
  /** Holds the task back this long after its creation (0–1 year). Not with `runAt`. */
  delaySeconds?: number;
  /** The number of steps, for progress. */
  steps?: number;
  /** Inline input bytes (≤ 1 MiB; a string is sent as UTF-8), stored as the task's INPUT artifact. */
  inputData?: Uint8Array | string;
  /** An INPUT artifact uploaded before. Not with `inputData`. */
  inputArtifactId?: string;
  /** Capabilities the claiming worker must all advertise. */
  requiredCapabilities?: string[];
  /** Labels the worker must have, each with this value. */
  affinity?: Record<string, string>;
  /** What one attempt holds on its worker (`cpu` millicores, `memory` MiB, `gpu`, `slots`, …). */
  resources?: Record<string, number | bigint>;
  /** Label requirements the worker must meet. */
  requirements?: MessageInitShape<typeof LabelRequirementSchema>[];
  /** Weighted label preferences among the workers that meet the requirements. */
  preferences?: MessageInitShape<typeof WeightedRequirementSchema>[];
  /** The share-tree path to charge the task to. */
  share?: string;
  /** Names a concurrency limit (ConcurrencyService.SetLimit). */
  concurrencyKey?: string;
  /** Names a rate limit (ConcurrencyService.SetRate). */
  rateKey?: string;
  /** This task's correlation id (default: the call's `x-correlation-id`). */
  correlationId?: string;
  /**
   * The name of the task within one `createMany` call, so that the others
   * can depend on it (`dependsOn: ["ref:NAME"]`). Kept as Task.ref.
   */
  ref?: string;
  /** Tasks this one waits for: task ids, tasks, or `ref:NAME` of the same `createMany` call. */
  dependsOn?: (string | { taskId: string })[];
  /**
   * What a dependency that did not succeed does: `"allSucceeded"` (the
   * default: this task FAILS with DEPENDENCY_FAILED) or `"allDone"` (this
   * task runs once every dependency finished, however it ended).
   */
  dependencyPolicy?: "allSucceeded" | "allDone";
}

/** One task of `createMany`: its workload, its parameters and its options. */
export interface TaskSpec<P extends object = JsonObject> extends TaskOptions {
  workload: string;
  params?: P;
}

/** A new random idempotency key. */
export function newKey(): string {
  return globalThis.crypto.randomUUID();
}

/** The CreateTaskRequest for a spec; the idempotency key is made here, once per logical create. */
export function createRequest(spec: TaskSpec<object>): CreateTaskRequest {
  if (spec.runAt !== undefined && spec.delaySeconds !== undefined) {
    throw new TypeError("a task takes runAt or delaySeconds, not both");
  }
  if (spec.inputData !== undefined && spec.inputArtifactId !== undefined) {
    throw new TypeError("a task takes inputData or inputArtifactId, not both");
  }
  const key = spec.idempotencyKey === false ? "" : (spec.idempotencyKey ?? newKey());
  const b = spec.retryBackoff;
  return create(CreateTaskRequestSchema, {
    name: spec.name ?? "",
    workload: spec.workload,
    parameters: (spec.params ?? {}) as JsonObject,
    idempotencyKey: key,
    priority: spec.priority ?? 0,
    maxAttempts: spec.maxAttempts,
    leaseSeconds: spec.leaseSeconds,
    timeoutSeconds: spec.timeoutSeconds,
    steps: spec.steps,
    deadline: spec.deadline ? timestampFromDate(spec.deadline) : undefined,
    retryBackoff: b
      ? {
          initial: b.initialMs !== undefined ? durationFromMs(b.initialMs) : undefined,
          max: b.maxMs !== undefined ? durationFromMs(b.maxMs) : undefined,
          multiplier: b.multiplier ?? 0,
        }
      : undefined,
    input:
      spec.inputData !== undefined
        ? {
            case: "inputData",
            value:
              typeof spec.inputData === "string"
                ? new TextEncoder().encode(spec.inputData)
                : spec.inputData,
          }
        : spec.inputArtifactId !== undefined
          ? { case: "inputArtifactId", value: spec.inputArtifactId }
          : undefined,
    start:
      spec.runAt !== undefined
        ? { case: "runAt", value: timestampFromDate(spec.runAt) }
        : spec.delaySeconds !== undefined
          ? { case: "delay", value: durationFromMs(spec.delaySeconds * 1000) }
          : undefined,
    requiredCapabilities: spec.requiredCapabilities ?? [],
    affinity: spec.affinity ?? {},
    resources: Object.fromEntries(
      Object.entries(spec.resources ?? {}).map(([k, v]) => [k, BigInt(v)]),
    ),
    requirements: spec.requirements ?? [],
    preferences: spec.preferences ?? [],
    share: spec.share ?? "",
    concurrencyKey: spec.concurrencyKey ?? "",
    rateKey: spec.rateKey ?? "",
    correlationId: spec.correlationId ?? "",
    ref: spec.ref ?? "",
    dependsOn: (spec.dependsOn ?? []).map((d) => (typeof d === "string" ? d : d.taskId)),
    dependencyPolicy:
      spec.dependencyPolicy === "allDone"
        ? DependencyPolicy.ALL_DONE
        : spec.dependencyPolicy === "allSucceeded"
          ? DependencyPolicy.ALL_SUCCEEDED
          : DependencyPolicy.UNSPECIFIED,
  });
}

/** Which tasks a bulk operation (cancelMany, rerunMany) acts on; at least one field. */
export interface TaskSelector {
  /** States the tasks may be in (default: every state the operation acts on). */
  states?: StateLike[];
  workload?: string;
  /** At most 1,000 ids. */
  taskIds?: string[];
  /** Created at or after. */
  createdAfter?: Date;
  /** Created before. */
  createdBefore?: Date;
}

export function taskFilter(s: TaskSelector): TaskFilter {
  return create(TaskFilterSchema, {
    states: (s.states ?? []).map(stateOf),
    workload: s.workload ?? "",
    taskIds: s.taskIds ?? [],
    createdAfter: s.createdAfter ? timestampFromDate(s.createdAfter) : undefined,
    createdBefore: s.createdBefore ? timestampFromDate(s.createdBefore) : undefined,
  });
}

/** A state by value or name. */
export function stateOf(s: StateLike): TaskState {
  if (typeof s === "number") return s;
  const value = TaskState[s];
  if (value === undefined) throw new TypeError(`unknown task state ${JSON.stringify(s)}`);
  return value;
}

/** Whether a task reached a terminal state. */
export function isFinished(task: Task): boolean {
  return (
    task.state === TaskState.SUCCEEDED ||
    task.state === TaskState.FAILED ||
    task.state === TaskState.CANCELED
  );
}

/** A task that SUCCEEDED, as `tasks.result()` resolves with it. */
export interface TaskOutcome<R = JsonObject> {
  taskId: string;
  /** The small JSON result the worker completed the task with (Task.result_value), if any. */
  value: R | undefined;
  /** The result artifact (id, URI, size, digest), if the worker uploaded one. */
  artifact: ArtifactRef | undefined;
  /** The worker's short description of the result. */
  summary: string;
  /** The numbers the worker reported with its completion. */
  metrics: Record<string, number>;
  /** The whole task, as it ended. */
  task: Task;
}

export function outcomeOf<R>(task: Task): TaskOutcome<R> {
  return {
    taskId: task.taskId,
    value: task.resultValue as R | undefined,
    artifact: task.result,
    summary: task.resultSummary,
    metrics: task.metrics,
    task,
  };
}
