import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ContextValues, type ServiceImpl } from "@connectrpc/connect";
import type {
  CreateTaskRequest,
  RetryTaskRequest,
  ScheduleTaskRequest,
  TaskFilter as TaskFilterMessage,
  TaskService,
} from "../../gen/meshwork/v1/task_pb.js";
import { toArtifactRefJson } from "../artifacts/convert.js";
import type { ArtifactStore } from "../artifacts/store.js";
import { storeUpload, type UploadDeps } from "../artifacts/uploads.js";
import { callerOf } from "../auth/principal.js";
import type { Config } from "../config.js";
import { canonicalJson } from "../core/canonical-json.js";
import { kCorrelationId, kCorrelationSent, kTrace } from "../core/context.js";
import { DomainError, invalid } from "../core/errors.js";
import { newTaskId } from "../core/ids.js";
import { decodeCursor, decodePageToken, pageSize } from "../core/paging.js";
import { shareOfCaller } from "../core/scheduling.js";
import { createWaker, linkedSignal } from "../core/signals.js";
import { terminalStates } from "../core/task-sql.js";
import { intInRange, text, timeField, uuidField } from "../core/validate.js";
import type { ArtifactRefJson, TaskRow, TaskStateName } from "../db/schema/index.js";
import type { LogTail } from "../logs/tail.js";
import type { Metrics } from "../metrics/metrics.js";
import type { WaitingReasons } from "../scheduling/why.js";
import { traceparentOf } from "../tracing/context.js";
import {
  type CreateOrigin,
  fromCreateRequest,
  fromTaskState,
  toTask,
  toTaskEvent,
} from "./convert.js";
import type { TaskEvents } from "./events.js";
import type { PlacementRequest, PlacementStore } from "./placement.js";
import type { BulkFilter, NewTask, TaskStore } from "./store.js";

/** What TaskService uses. */
export interface TaskServiceDeps extends UploadDeps {
  config: Pick<
    Config,
    "maxArtifactBytes" | "publicUrl" | "defaultShare" | "dispatchDefault" | "dispatchWorkloads"
  >;
  tasks: TaskStore;
  placement: PlacementStore;
  artifacts: Pick<ArtifactStore, "checkLease" | "insert" | "get" | "removeUnusedInputs">;
  events: TaskEvents;
  /** Why a PENDING task waits (scheduling/why.ts), for GetTask. */
  waitingReasons: Pick<WaitingReasons, "of">;
  /** Task log tails (src/logs/): GetTaskLogs, WatchTaskLogs. */
  logTail: Pick<LogTail, "page" | "watch">;
  /** Ends watchers at shutdown. */
  shutdownSignal: AbortSignal;
  metrics: Pick<Metrics, "tasksCreated" | "artifactBytesIn">;
  /** Delivers placed tasks with dispatch (fleet/dispatch.ts): told after each placement. */
  dispatcher: { kick(): void };
}

/** How often a watcher re-reads its task when nothing happened on this replica. */
const watchRecheckMs = 5000;

/** The fields ScheduleTask and RetryTask share, checked. */
/**
 * A placement's fields. The correlation id recorded is the body's, else the
 * one the caller sent in its headers (never a generated one); empty keeps
 * the task's.
 */
function placementOf(
  req: ScheduleTaskRequest | RetryTaskRequest,
  sentCorrelationId: string,
): PlacementRequest {
  return {
    taskId: uuidField("task_id", req.taskId),
    key: text("schedule_idempotency_key", req.scheduleIdempotencyKey, { optional: true }),
    correlationId:
      req.correlationId === ""
        ? sentCorrelationId
        : text("correlation_id", req.correlationId, { optional: true }),
    leaseSeconds:
      req.leaseSeconds === undefined
        ? 600
        : intInRange("lease_seconds", req.leaseSeconds, 60, 86_400),
  };
}

/**
 * Resolves each request's input (storing inline input_data as an INPUT
 * artifact) and creates the tasks; then removes the inputs stored here
 * that no task ended up naming: the create was refused (or a later entry's
 * input was), or an idempotent repeat answered with the task created before
 * (with its own input). Twenty identical creates leave one input, not
 * twenty. The clean-up is best effort: it never fails a create.
 */
async function createWithInputs(
  app: TaskServiceDeps,
  entries: { req: CreateTaskRequest; task: NewTask; field: string }[],
): Promise<TaskRow[]> {
  const stored: string[] = [];
  const cleanUp = (used: Set<string>) =>
    app.artifacts.removeUnusedInputs(stored.filter((id) => !used.has(id))).catch(() => {});
  let rows: TaskRow[];
  try {
    for (const { req, task, field } of entries) {
      task.input = await resolveInput(app, req, field);
      if (req.input.case === "inputData" && task.input) stored.push(task.input.artifactId);
    }
    // Ids given here tell new tasks from idempotent repeats (answered with the task made before).
    for (const e of entries) e.task.id = newTaskId();
    rows = await app.tasks.create(entries.map((e) => e.task));
  } catch (error) {
    await cleanUp(new Set());
    throw error;
  }
  rows.forEach((row, i) => {
    if (row.id === entries[i]?.task.id) app.metrics.tasksCreated.inc({ workload: row.workload });
  });
  await cleanUp(new Set(rows.map((r) => r.input?.artifactId ?? "")));
  return rows;
}

/** Bytes of inline input_data: at most 1 MiB. */
const maxInlineInput = 1024 * 1024;

/**
 * The input a create names: an INPUT artifact uploaded before (without a
 * task), or inline bytes stored now as one.
 */
async function resolveInput(
  app: TaskServiceDeps,
  req: CreateTaskRequest,
  field = "",
): Promise<ArtifactRefJson | null> {
  const publicUrl = app.config.publicUrl;
  switch (req.input.case) {
    case "inputArtifactId": {
      const row = await app.artifacts.get(uuidField(`${field}input_artifact_id`, req.input.value));
      if (row.kind !== "INPUT" || row.taskId !== null) {
        throw invalid(
          `${field}input_artifact_id must name an INPUT artifact uploaded without a task`,
        );
      }
      return toArtifactRefJson(row, publicUrl);
    }
    case "inputData": {
      const data = req.input.value;
      if (data.byteLength > maxInlineInput) {
        throw invalid(
          `${field}input_data is larger than 1 MiB: upload it and pass input_artifact_id`,
        );
      }
      const row = await storeUpload(
        app,
        {
          taskId: "",
          workerId: "",
          attempt: 0,
          leaseToken: "",
          filename: "input",
          contentType: "application/octet-stream",
          kind: "INPUT",
          sha256: "",
          sizeBytes: data.byteLength,
        },
        (async function* () {
          yield data;
        })(),
      );
      return toArtifactRefJson(row, publicUrl);
    }
    default:
      return null;
  }
}

/**
 * A bulk operation's filter, checked: at least one field set (an empty
 * filter would act on every task), states among those the operation acts
 * on (`actsOn` when none is given), at most 1,000 task ids.
 */
function bulkFilterOf(
  filter: TaskFilterMessage | undefined,
  actsOn: readonly TaskStateName[],
  what: string,
): BulkFilter {
  const f = filter;
  if (
    !f ||
    (f.states.length === 0 &&
      f.workload === "" &&
      f.taskIds.length === 0 &&
      !f.createdAfter &&
      !f.createdBefore)
  ) {
    throw invalid(
      "filter must set at least one of states, workload, task_ids, created_after, created_before",
    );
  }
  const states = f.states.map((st, i) => {
    const name = fromTaskState(st);
    if (name === undefined || !actsOn.includes(name)) {
      throw invalid(`filter.states[${i}]: ${what} acts on ${actsOn.join(", ")} tasks only`);
    }
    return name;
  });
  if (f.taskIds.length > 1000) {
    throw invalid(`filter.task_ids holds ${f.taskIds.length} ids; at most 1000`);
  }
  return {
    states: states.length > 0 ? [...new Set(states)] : [...actsOn],
    workload: f.workload === "" ? undefined : text("filter.workload", f.workload),
    taskIds:
      f.taskIds.length === 0
        ? undefined
        : f.taskIds.map((id, i) => uuidField(`filter.task_ids[${i}]`, id)),
    createdAfter: f.createdAfter
      ? timeField("filter.created_after", timestampDate(f.createdAfter))
      : undefined,
    createdBefore: f.createdBefore
      ? timeField("filter.created_before", timestampDate(f.createdBefore))
      : undefined,
  };
}

/** What a cancel records as its reason: the client's, cut to 2 KiB, or a default. */
const cancelReason = (reason: string) =>
  reason === "" ? "cancelled by a client" : reason.slice(0, 2048);

/**
 * The correlation id and trace context a created task records: the
 * request's trace with the CreateTask span as parent, so that a worker's
 * calls for the task continue the creator's trace (docs/tracing.md).
 */
function originOf(
  values: ContextValues,
  config: Pick<Config, "defaultShare" | "dispatchDefault" | "dispatchWorkloads">,
): CreateOrigin {
  const trace = values.get(kTrace);
  const defaultShare = config.defaultShare;
  return {
    dispatch: config.dispatchDefault,
    dispatchWorkloads: config.dispatchWorkloads,
    correlationId: values.get(kCorrelationId),
    share: defaultShare || shareOfCaller(callerOf(values).name),
    traceparent: trace ? traceparentOf(trace) : "",
    tracestate: trace?.state ?? "",
  };
}

/** TaskService: create, read, watch, cancel, and push placement (ScheduleTask, RetryTask). */
export function createTaskService(app: TaskServiceDeps): ServiceImpl<typeof TaskService> {
  /** A placement's answer; a task with dispatch is delivered now, by this replica (fleet/dispatch.ts). */
  async function placed(row: TaskRow) {
    app.events.emit([row.id]);
    if (row.dispatch) app.dispatcher.kick();
    const delivery = await app.tasks.deliveries([row]);
    return { task: toTask(row, true, {}, delivery.get(row.id)) };
  }
  return {
    async createTask(req, ctx) {
      const task = fromCreateRequest(req, originOf(ctx.values, app.config));
      const [row] = await createWithInputs(app, [{ req, task, field: "" }]);
      if (!row) throw new Error("create returned no task");
      return { task: toTask(row) };
    },

    async createTasks(req, ctx) {
      if (req.tasks.length === 0 || req.tasks.length > 1000) {
        throw invalid(`tasks must hold 1 to 1000 tasks, not ${req.tasks.length}`);
      }
      const origin = originOf(ctx.values, app.config);
      const entries = req.tasks.map((t, i) => ({
        req: t,
        task: fromCreateRequest(t, origin, `tasks[${i}].`),
        field: `tasks[${i}].`,
      }));
      // Parked claims are woken by the insert's NOTIFY (with its counts), on every replica.
      const rows = await createWithInputs(app, entries);
      return { tasks: rows.map((r) => toTask(r)) };
    },

    async getTask(req) {
      const row = await app.tasks.get(uuidField("task_id", req.taskId));
      const [outputs, waiting, delivery] = await Promise.all([
        app.tasks.dependencyOutputs([row]),
        app.waitingReasons.of(row),
        app.tasks.deliveries([row]),
      ]);
      return { task: toTask(row, false, outputs.get(row.id), delivery.get(row.id)), ...waiting };
    },

    async listTasks(req) {
      const page = await app.tasks.list(
        {
          state: fromTaskState(req.state),
          workload: req.workload === "" ? undefined : text("workload", req.workload),
          correlationId:
            req.correlationId === "" ? undefined : text("correlation_id", req.correlationId),
          workerId: req.workerId === "" ? undefined : uuidField("worker_id", req.workerId),
        },
        pageSize(req.pageSize),
        decodeCursor(req.pageToken),
      );
      const delivery = await app.tasks.deliveries(page.rows);
      return {
        tasks: page.rows.map((r) => toTask(r, false, {}, delivery.get(r.id))),
        nextPageToken: page.next,
      };
    },

    async listTaskEvents(req) {
      const page = await app.tasks.events(
        uuidField("task_id", req.taskId),
        pageSize(req.pageSize),
        decodePageToken(req.pageToken, 1, (k) => /^[1-9][0-9]{0,15}$/.test(k))?.keys.map(Number)[0],
      );
      return { events: page.rows.map(toTaskEvent), nextPageToken: page.next };
    },

    async *watchTask(req, ctx) {
      const id = uuidField("task_id", req.taskId);
      const linked = linkedSignal(ctx.signal, app.shutdownSignal);
      const { signal } = linked;
      const waker = createWaker(signal);
      const unsubscribe = app.events.subscribe(id, waker.wake);
      try {
        let last = "";
        while (!signal.aborted) {
          waker.woken();
          const row = await app.tasks.get(id);
          const delivery = (await app.tasks.deliveries([row])).get(row.id);
          // A delivery's progress is a change too.
          const seen = canonicalJson({ row, delivery });
          if (seen !== last) {
            last = seen;
            const outputs = await app.tasks.dependencyOutputs([row]);
            yield { task: toTask(row, false, outputs.get(row.id), delivery) };
          }
          if (terminalStates.includes(row.state)) return;
          if (waker.woken()) continue;
          await waker.wait(watchRecheckMs);
        }
      } finally {
        unsubscribe();
        linked.dispose();
      }
    },

    async scheduleTask(req, ctx) {
      const row = await app.placement.schedule(placementOf(req, ctx.values.get(kCorrelationSent)));
      return placed(row);
    },

    async retryTask(req, ctx) {
      const row = await app.placement.retry(placementOf(req, ctx.values.get(kCorrelationSent)));
      return placed(row);
    },

    async cancelTask(req) {
      const id = uuidField("task_id", req.taskId);
      const row = await app.tasks.cancel(id, cancelReason(req.reason));
      app.events.emit([id]);
      return { task: toTask(row) };
    },

    async rerunTask(req) {
      const id = uuidField("task_id", req.taskId);
      const [row] = await app.tasks.rerun({ states: ["FAILED", "CANCELED"], taskIds: [id] }, 1);
      if (!row) {
        const current = await app.tasks.get(id);
        throw new DomainError(
          "failed_precondition",
          "INVALID_STATE",
          `task ${id} is ${current.state}: only a FAILED or CANCELED task can be rerun`,
          { taskId: id },
        );
      }
      app.events.emit([id]);
      if (req.rerunDependents) {
        // The tasks it failed come back waiting for it, together in one
        // transaction (after its own): a dependent must not be recounted
        // while its own dependency, also coming back, is still FAILED.
        const down = await app.tasks.failedDependents(id);
        if (down.length > 0) {
          const rows = await app.tasks.rerun(
            { states: ["FAILED"], taskIds: down },
            down.length,
            down.length,
          );
          app.events.emit(rows.map((r) => r.id));
        }
      }
      return { task: toTask(row) };
    },

    async rerunTasks(req) {
      const filter = bulkFilterOf(req.filter, ["FAILED", "CANCELED"], "RerunTasks");
      if (req.dryRun) return { count: await app.tasks.countMatching(filter) };
      const rows = await app.tasks.rerun(filter);
      app.events.emit(rows.map((r) => r.id));
      return { count: rows.length };
    },

    async cancelTasks(req) {
      const filter = bulkFilterOf(req.filter, ["PENDING", "ASSIGNED", "RUNNING"], "CancelTasks");
      if (req.dryRun) return { count: await app.tasks.countMatching(filter) };
      const ids = await app.tasks.cancelMatching(filter, cancelReason(req.reason));
      app.events.emit(ids);
      return { count: ids.length };
    },

    getTaskLogs: (req) => app.logTail.page(req),

    async *watchTaskLogs(req, ctx) {
      const linked = linkedSignal(ctx.signal, app.shutdownSignal);
      try {
        // Woken by new lines and by the task's changes (its end) on this replica.
        yield* app.logTail.watch(req, linked.signal, [app.events.subscribe]);
        // A coordinator shutting down ends the stream before the task did:
        // `unavailable`, so that a follower reconnects (to another replica)
        // rather than take the end for the task's.
        if (app.shutdownSignal.aborted && !ctx.signal.aborted) {
          throw new ConnectError("the coordinator is shutting down", Code.Unavailable);
        }
      } finally {
        linked.dispose();
      }
    },
  };
}
