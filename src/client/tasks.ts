import type { JsonObject } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import type {
  LogLine,
  Task,
  TaskEvent,
  TaskService,
  WaitReason,
} from "../../gen/meshwork/v1/task_pb.js";
import {
  createRequest,
  type StateLike,
  stateOf,
  type TaskOptions,
  type TaskOutcome,
  type TaskSelector,
  type TaskSpec,
  taskFilter,
} from "./convert.js";
import type { RetryOptions } from "./rpc.js";
import {
  followLogs,
  type LogsOptions,
  pagedLogs,
  resultOf,
  type WaitOptions,
  watchTask,
} from "./stream.js";

/** Per-call options: an abort signal, a timeout, extra headers (e.g. `x-correlation-id`). */
export interface CallOptions {
  signal?: AbortSignal;
  /** The call's deadline, retries included. */
  timeoutMs?: number;
  headers?: Record<string, string>;
}

/** A task, or its id. */
export type TaskRef = string | { taskId: string };

/** What `tasks.list()` keeps, and how many it reads per call. */
export interface ListQuery {
  state?: StateLike;
  workload?: string;
  correlationId?: string;
  /** Tasks whose current or last lease, or whose placement, is this worker's. */
  workerId?: string;
  /** Tasks per ListTasks call (1–1000, default 100). */
  pageSize?: number;
}

/** `client.tasks`: create, wait for, read, cancel and rerun tasks (TaskService). */
export interface TasksApi {
  /**
   * Creates one PENDING task of `workload` with `params` (a JSON object;
   * name its type, `create<MyParams>(…)`, to have it checked). Safe to retry:
   * an idempotency key is made for the call unless `options.idempotencyKey`
   * gives one (or is `false`).
   */
  create<P extends object = JsonObject>(
    workload: string,
    params?: P,
    options?: TaskOptions & CallOptions,
  ): Promise<Task>;
  /**
   * Creates up to 1,000 tasks in one transaction (CreateTasks), all or
   * none, returned in the same order. Tasks of the call may depend on each
   * other by `ref` (`dependsOn: ["ref:NAME"]`).
   */
  createMany<P extends object = JsonObject>(
    specs: TaskSpec<P>[],
    options?: CallOptions,
  ): Promise<Task[]>;
  /** Creates a task, then waits for its outcome, as `create` then `result` do. */
  run<R = JsonObject, P extends object = JsonObject>(
    workload: string,
    params?: P,
    options?: TaskOptions & WaitOptions,
  ): Promise<TaskOutcome<R>>;
  /**
   * Waits for a task to finish (WatchTask, reopened when it breaks):
   * resolves with its outcome when it SUCCEEDED (`value`: its result value,
   * `artifact`: its result artifact); rejects with TaskFailedError (its
   * `code` and `message`) when it FAILED or was CANCELED, with
   * TaskWaitTimeoutError after `timeoutMs`, or with the signal's reason.
   * Giving up never changes the task.
   */
  result<R = JsonObject>(task: TaskRef, options?: WaitOptions): Promise<TaskOutcome<R>>;
  /** The task as it is now, then after each change, until it finished. */
  watch(task: TaskRef, options?: { signal?: AbortSignal }): AsyncIterable<Task>;
  /** Reads a task (not_found for an unknown id). */
  get(task: TaskRef, options?: CallOptions): Promise<Task>;
  /** A task with, for a PENDING one, why it waits and its place in its share's queue. */
  inspect(
    task: TaskRef,
    options?: CallOptions,
  ): Promise<{ task: Task; waiting: WaitReason[]; queuePosition: number }>;
  /** Every task the query keeps, newest first, read a page at a time as iterated. */
  list(query?: ListQuery, options?: CallOptions): AsyncIterable<Task>;
  /** A task's history, oldest first: its creation, then each change of state, attempt or holder. */
  events(task: TaskRef, options?: CallOptions): AsyncIterable<TaskEvent>;
  /** Cancels a PENDING, ASSIGNED or RUNNING task (failed_precondition once it finished). */
  cancel(task: TaskRef, options?: CallOptions & { reason?: string }): Promise<Task>;
  /**
   * Puts a FAILED or CANCELED task back to PENDING under the same id;
   * `rerunDependents` also puts back the tasks that failed because it did.
   */
  rerun(task: TaskRef, options?: CallOptions & { rerunDependents?: boolean }): Promise<Task>;
  /** Cancels every live task the selector matches (at most 10,000); the count. `dryRun` only counts. */
  cancelMany(
    selector: TaskSelector,
    options?: CallOptions & { dryRun?: boolean; reason?: string },
  ): Promise<number>;
  /** Reruns every FAILED or CANCELED task the selector matches (at most 10,000); the count. */
  rerunMany(selector: TaskSelector, options?: CallOptions & { dryRun?: boolean }): Promise<number>;
  /** The log lines the coordinator keeps for a task, oldest first (GetTaskLogs, page after page). */
  logs(task: TaskRef, options?: LogsOptions): AsyncIterable<LogLine>;
  /**
   * A task's log lines as they come (WatchTaskLogs), from `afterSequence`,
   * until the task finished and every line was sent.
   */
  followLogs(
    task: TaskRef,
    options?: { afterSequence?: bigint; signal?: AbortSignal },
  ): AsyncIterable<LogLine>;
}

export function idOf(task: TaskRef): string {
  return typeof task === "string" ? task : task.taskId;
}

/** The tasks API over a TaskService client. */
export function createTasksApi(rpc: Client<typeof TaskService>, retry?: RetryOptions): TasksApi {
  const api: TasksApi = {
    async create(workload, params, options = {}) {
      const { signal, timeoutMs, headers, ...spec } = options;
      const request = createRequest({ ...spec, workload, params: params ?? {} });
      const { task } = await rpc.createTask(request, { signal, timeoutMs, headers });
      return required(task);
    },

    async createMany(specs, options = {}) {
      // Each task's key is made once, here: the retries send the same request.
      const tasks = specs.map((spec) => createRequest(spec));
      const res = await rpc.createTasks({ tasks }, options);
      return res.tasks;
    },

    async run(workload, params, options = {}) {
      const { timeoutMs, signal, ...spec } = options;
      const task = await api.create(workload, params, { ...spec, signal });
      return resultOf(rpc, task.taskId, { timeoutMs, signal, retry });
    },

    result(task, options = {}) {
      return resultOf(rpc, idOf(task), { ...options, retry });
    },

    watch(task, options = {}) {
      return watchTask(rpc, idOf(task), { signal: options.signal, retry });
    },

    async get(task, options) {
      return required((await rpc.getTask({ taskId: idOf(task) }, options)).task);
    },

    async inspect(task, options) {
      const res = await rpc.getTask({ taskId: idOf(task) }, options);
      return { task: required(res.task), waiting: res.waiting, queuePosition: res.queuePosition };
    },

    async *list(query = {}, options) {
      let pageToken = "";
      do {
        const page = await rpc.listTasks(
          {
            pageSize: query.pageSize ?? 0,
            pageToken,
            state: query.state === undefined ? 0 : stateOf(query.state),
            workload: query.workload ?? "",
            correlationId: query.correlationId ?? "",
            workerId: query.workerId ?? "",
          },
          options,
        );
        yield* page.tasks;
        pageToken = page.nextPageToken;
      } while (pageToken);
    },

    async *events(task, options) {
      let pageToken = "";
      do {
        const page = await rpc.listTaskEvents({ taskId: idOf(task), pageToken }, options);
        yield* page.events;
        pageToken = page.nextPageToken;
      } while (pageToken);
    },

    async cancel(task, options = {}) {
      const { reason, ...call } = options;
      const res = await rpc.cancelTask({ taskId: idOf(task), reason: reason ?? "" }, call);
      return required(res.task);
    },

    async rerun(task, options = {}) {
      const { rerunDependents, ...call } = options;
      const res = await rpc.rerunTask(
        { taskId: idOf(task), rerunDependents: rerunDependents ?? false },
        call,
      );
      return required(res.task);
    },

    async cancelMany(selector, options = {}) {
      const { dryRun, reason, ...call } = options;
      const res = await rpc.cancelTasks(
        { filter: taskFilter(selector), dryRun: dryRun ?? false, reason: reason ?? "" },
        call,
      );
      return res.count;
    },

    async rerunMany(selector, options = {}) {
      const { dryRun, ...call } = options;
      const res = await rpc.rerunTasks(
        { filter: taskFilter(selector), dryRun: dryRun ?? false },
        call,
      );
      return res.count;
    },

    logs(task, options = {}) {
      return pagedLogs(rpc, idOf(task), options);
    },

    followLogs(task, options = {}) {
      return followLogs(rpc, idOf(task), { ...options, retry });
    },
  };
  return api;
}

/** The task of a response, which the coordinator always sets. */
function required(task: Task | undefined): Task {
  if (!task) throw new Error("the coordinator answered without a task");
  return task;
}
