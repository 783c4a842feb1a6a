import type { JsonObject } from "@bufbuild/protobuf";
import {
  type Client,
  createClient as createRpcClient,
  type Interceptor,
} from "@connectrpc/connect";
import type { ArtifactRef } from "../../gen/meshwork/v1/artifact_pb.js";
import { type Schedule, ScheduleService } from "../../gen/meshwork/v1/schedule_pb.js";
import {
  type LogLine,
  type Task,
  type TaskEvent,
  TaskService,
  TaskState,
} from "../../gen/meshwork/v1/task_pb.js";
import { clientTransport, type RetryOptions } from "./rpc.js";
import { createSchedulesApi, type SchedulesApi } from "./schedules.js";
import { createTasksApi, type TasksApi } from "./tasks.js";

// The client SDK (meshwork/client): this file is its public API. Its parts:
// tasks.ts (TaskService as `client.tasks`), stream.ts (WatchTask and
// WatchTaskLogs, reopened when they break: result(), watch(), followLogs()),
// schedules.ts (ScheduleService), convert.ts (plain options → requests),
// errors.ts, rpc.ts (transport, headers, trace context, retries on
// `unavailable`). Like the worker SDK it imports only gen/ and npm packages.

export { Code, ConnectError } from "@connectrpc/connect";
export type { StateLike, TaskOptions, TaskOutcome, TaskSelector, TaskSpec } from "./convert.js";
export { TaskFailedError, TaskWaitTimeoutError } from "./errors.js";
export type { RetryOptions } from "./rpc.js";
export type { ScheduleSpec, SchedulesApi } from "./schedules.js";
export type { LogsOptions, WaitOptions } from "./stream.js";
export type { CallOptions, ListQuery, TaskRef, TasksApi } from "./tasks.js";
export type { ArtifactRef, JsonObject, LogLine, Schedule, Task, TaskEvent };
export { TaskState };

/** How to reach the coordinator. */
export interface ClientOptions {
  /** The coordinator's URL, e.g. `http://127.0.0.1:8080` (https:// for TLS). */
  baseUrl: string;
  /** A bearer token with the `client` (or `admin`) role; none when auth is off. */
  token?: string;
  /**
   * `"connect"` (default: the Connect protocol over HTTP/1.1, through any
   * HTTP proxy) or `"grpc"` (gRPC over HTTP/2: h2c for http://).
   */
  transport?: "connect" | "grpc";
  /**
   * Sent as `x-correlation-id` on every call: the coordinator logs it with
   * each request and stores it on the tasks created (unless a task sets its
   * own `correlationId`). A call's `headers` may override it.
   */
  correlationId?: string;
  /** More headers for every call. */
  headers?: Record<string, string>;
  /**
   * Retries of a call answered `unavailable` (a restart, the database away
   * for a moment), and of no other code; a create keeps its idempotency key
   * across them. Streams are reopened from where they were on the same terms.
   * Calls that a second try could do twice (trigger, cancel, rerun, delete,
   * placements) are sent once: their `unavailable` reaches the caller.
   */
  retry?: RetryOptions;
  /** Connect interceptors, innermost: run on each try of a call. */
  interceptors?: Interceptor[];
}

/** A Meshwork client: `tasks`, `schedules`, and the raw generated clients. */
export interface MeshworkClient {
  tasks: TasksApi;
  schedules: SchedulesApi;
  /** The generated Connect clients, with the same headers and retries, for what the API above leaves out. */
  rpc: {
    tasks: Client<typeof TaskService>;
    schedules: Client<typeof ScheduleService>;
  };
}

/**
 * A client of a Meshwork coordinator. Every call carries the token, a W3C
 * `traceparent` (the active OpenTelemetry span's, else a new trace: the
 * tasks created keep it, and the workers that run them get it), and the
 * correlation id when one is set.
 *
 * @example
 * const client = createClient({ baseUrl: "http://127.0.0.1:8080", token });
 * const task = await client.tasks.create<{ frame: number }>("render", { frame: 1 });
 * const { value } = await client.tasks.result(task, { timeoutMs: 60_000 });
 */
export function createClient(options: ClientOptions): MeshworkClient {
  const transport = clientTransport(options);
  const tasks = createRpcClient(TaskService, transport);
  const schedules = createRpcClient(ScheduleService, transport);
  return {
    tasks: createTasksApi(tasks, options.retry),
    schedules: createSchedulesApi(schedules),
    rpc: { tasks, schedules },
  };
}
