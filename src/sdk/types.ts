import type { JsonObject } from "@bufbuild/protobuf";
import type { Interceptor, Transport } from "@connectrpc/connect";
import type { Artifact, ArtifactRef } from "../../gen/meshwork/v1/artifact_pb.js";

// The SDK's public types, exported by worker.ts (meshwork/worker).

/** A claimed task as the handler sees it. */
export interface WorkerTask {
  /** The task id. */
  id: string;
  /** The attempt this lease belongs to (1 for the first). */
  attempt: number;
  workload: string;
  name: string;
  /** The task's parameters ({} when it has none). */
  parameters: JsonObject;
  /** The input artifact, when the task has one; `ctx.input()` downloads it. */
  input: ArtifactRef | undefined;
  /**
   * The OUTPUT artifacts of the task's dependencies that succeeded, by name
   * (`<ref or task id>/<filename>`, `<ref or task id>/result` for a
   * dependency's result artifact) → artifact id; `ctx.inputs` downloads them.
   */
  dependencyOutputs: Record<string, string>;
  /**
   * The task's bound on an attempt's running time in seconds (0: none):
   * past it the lease is not renewed and the attempt fails with TIMEOUT.
   */
  timeoutSeconds: number;
  /** What a previous attempt recorded when it was released ("" for none). */
  checkpoint: string;
  correlationId: string;
  /**
   * The task's W3C trace context (`traceparent`, "" for a task created
   * before Meshwork stored one): the trace of the request that created it.
   * The SDK sends it on its calls for the task (complete, fail, release,
   * renewals by RenewLease, uploads, downloads); a handler that makes spans
   * or calls other services parents them on it.
   */
  traceparent: string;
  /** The trace id of `traceparent` (32 hex digits), "" without one. */
  traceId: string;
  /** The task's W3C `tracestate`, "" for none. */
  tracestate: string;
  /** The task's number of steps, when known. */
  steps: number | undefined;
  /** The lease TTL in seconds; the SDK renews it. */
  leaseSeconds: number;
  /**
   * What the lease holds on this worker for the task (its `resources`,
   * `slots` included), e.g. `{ gpu: 1, slots: 1 }`: what to give it.
   */
  resources: Record<string, number>;
}

/** What `ctx.upload` stores: bytes, text, or a stream of chunks (a Node Readable is one). */
export type UploadBody = Uint8Array | string | AsyncIterable<Uint8Array | string>;

/** Options of `ctx.upload`. */
export interface UploadOptions {
  /** Media type; default application/octet-stream. */
  contentType?: string;
  /** "output" (default) or "checkpoint" (for `ctx.checkpoint`). */
  kind?: "output" | "checkpoint";
}

/**
 * An output of one of the task's dependencies, offered as a named input
 * (`ctx.inputs[name]`). Nothing is downloaded until a method is called, and
 * each call downloads it again, under the task's lease, checking its
 * SHA-256 against its artifact's (a TaskError InputChecksumMismatch when
 * they differ).
 */
export interface NamedInput {
  /** `<ref or task id>/<filename>`, or `<ref or task id>/result` for the dependency's result artifact. */
  name: string;
  /** The artifact's id (ArtifactService.DownloadArtifact, GET /artifacts/{id}/download). */
  artifactId: string;
  /** Downloads it whole and checks its SHA-256; retried from scratch after a transient failure. */
  bytes(): Promise<Uint8Array>;
  /**
   * Streams it into the file at `path` (created or truncated) without
   * holding it in memory, checking its SHA-256 as it goes; on a mismatch
   * the file is removed and a TaskError thrown. Resolves with its size.
   */
  save(path: string): Promise<number>;
  /**
   * Its bytes as they arrive, in one try (not retried). The SHA-256 is
   * checked after the last chunk: a mismatch throws from the iteration
   * then, so act on what was read only once it ended without error.
   */
  stream(): AsyncIterable<Uint8Array>;
}

/** What a handler gets besides the task: its lease's signal and the calls made under its lease. */
export interface TaskContext {
  /** Same as `task.parameters`. */
  parameters: JsonObject;
  /** Same as `task.traceparent`: the task's W3C trace context. */
  traceparent: string;
  /** Same as `task.traceId`. */
  traceId: string;
  /**
   * Aborts when the task is no longer this worker's: the lease was lost, the
   * task was cancelled, or the worker stopped and released it after its grace
   * period. `signal.reason` is a LeaseEndedError. Whatever the handler
   * returns afterwards is dropped: no completion or failure is sent.
   */
  signal: AbortSignal;
  /**
   * The task's bound on an attempt's running time in seconds (0: none),
   * as `task.timeoutSeconds`: past it the lease ends (`signal` aborts).
   */
  timeoutSeconds: number;
  /** Downloads the input and checks its SHA-256 (a TaskError when it has none or it differs). */
  input(): Promise<Uint8Array>;
  /**
   * The OUTPUT artifacts of the task's dependencies as named inputs, by
   * `<ref or task id>/<filename>` (`<ref or task id>/result` for a
   * dependency's result artifact), e.g. `await ctx.inputs["prep/data.csv"]?.bytes()`.
   * `<ref or task id>` is the dependency's ref in the CreateTasks call that
   * made them, else its task id. Empty for a task without dependencies.
   */
  inputs: Readonly<Record<string, NamedInput>>;
  /**
   * Streams the input into the file at `path` (created or truncated) without
   * holding it in memory, checking its SHA-256 as it goes; on a mismatch the
   * file is removed and a TaskError thrown. Resolves with its size in bytes.
   */
  saveInput(path: string): Promise<number>;
  /** Uploads an artifact of this task under its lease and returns it (pass it as `result`). */
  upload(name: string, body: UploadBody, options?: UploadOptions): Promise<Artifact>;
  /** Records progress; it goes with the next lease renewal. */
  progress(completedSteps: number, message?: string): void;
  /**
   * Sets the handle (a CHECKPOINT artifact's id or an opaque string) sent
   * with ReleaseTask if the worker stops before the handler finishes; the
   * next attempt gets it as `task.checkpoint`.
   */
  checkpoint(handle: string): void;
  /**
   * Sends `text` to the task's log (one line per line; each ≤ 8 KiB, cut
   * past it), which `meshwork task logs ID` and the dashboard show.
   * Batched, best effort, sent before the task completes. `stream` is
   * `log` (the default), `stdout` or `stderr`.
   */
  log(text: string, stream?: "stdout" | "stderr" | "log"): void;
}

/** What a handler returns to complete its task (all optional). */
export interface TaskResult {
  /** The result artifact: what `ctx.upload` returned. */
  result?: Pick<ArtifactRef, "artifactId" | "uri" | "sha256"> | undefined;
  /** A short description (≤ 4 KiB). */
  summary?: string | undefined;
  /** Numbers about the run. */
  metrics?: Record<string, number> | undefined;
  /**
   * A small JSON object (≤ 64 KiB as JSON) kept as the task's
   * `result_value`, which GetTask and the client SDKs return. It is sent
   * as JSON.stringify makes it (a Date becomes its ISO string, an
   * undefined field is left out), so any object type is taken; an array,
   * or an object that cannot be made JSON (a BigInt, a cycle), fails the
   * task with ResultValueInvalid, and one over 64 KiB as JSON with
   * ResultValueTooLarge (neither retried).
   */
  value?: object | undefined;
}

/** Runs one task. Return to complete it; throw to fail it (see TaskError). */
export type TaskHandler = (task: WorkerTask, ctx: TaskContext) => HandlerReturn;

// biome-ignore lint/suspicious/noConfusingVoidType: an async handler that returns nothing is a Promise<void>
type HandlerReturn = Promise<TaskResult | undefined | void> | TaskResult | undefined | void;

/** Options of createWorker. */
export interface WorkerOptions {
  /** The coordinator, e.g. http://127.0.0.1:8080 (h2c) or https://… */
  url: string;
  /** A token of role worker ("" when the coordinator runs with auth off). */
  token: string;
  /**
   * The workloads this worker runs. They are registered as capabilities:
   * the coordinator gives a worker a task when the task's workload and every
   * one of its required_capabilities are among the worker's capabilities.
   */
  workloads: string[];
  /** Further capabilities (features a task may require, e.g. "gpu"), registered with the workloads. */
  capabilities?: string[];
  /** Labels matched by task affinity, requirements and preferences. */
  labels?: Record<string, string>;
  /**
   * What the worker offers besides its slots (`concurrency`): resource
   * name → quantity, e.g. `{ gpu: 2, "license/houdini": 1 }`. `cpu`
   * (millicores) and `memory` (MiB) default to the host's (docs/scheduling.md).
   */
  capacity?: Record<string, number>;
  /** Worker name; default the host name. */
  name?: string;
  /** A stable peer_id: registering again with it updates the same worker. */
  peerId?: string;
  /** Tasks run at once (registered as max_concurrency); default 1. */
  concurrency?: number;
  handler: TaskHandler;
  /** How long one claim waits for work (0–30 s); default 20. */
  pollSeconds?: number;
  /** On stop, how long running handlers may take before their tasks are released; default 30 s. */
  graceMs?: number;
  /** On stop, after the running tasks: "deregister" (default) removes the worker, "drain" leaves it registered and drained. */
  onStop?: "deregister" | "drain";
  /** Stop on SIGTERM/SIGINT (a second signal skips the grace period); default true. */
  installSignalHandlers?: boolean;
  /** Renew over one StreamLeases stream (default true); false renews with RenewLease only. */
  leaseStreams?: boolean;
  /** How long a finished task waits for others to complete with it in one CompleteTasks; default 20 ms. */
  completionBatchMs?: number;
  /**
   * The deadline of each RegisterWorker, CompleteTask(s), FailTask,
   * ReleaseTask, DrainWorker and DeregisterWorker call (each try, when it is
   * retried); default 30 s. Uploads and downloads run as long as the lease.
   */
  callTimeoutMs?: number;
  /**
   * How long registration keeps trying a coordinator it cannot reach (it
   * logs one line at the first refused try), then `done` rejects with one
   * error naming the URL and the cause; default 10 s.
   */
  connectWithinMs?: number;
  /** Extra Connect interceptors (after the bearer token). */
  interceptors?: Interceptor[];
  /** A transport to use instead of the SDK's gRPC one (then `url`, `token` and `interceptors` are not used). */
  transport?: Transport;
  /** Where log lines go; default stderr. */
  log?: (message: string) => void;
}

/** A running worker. */
export interface Worker {
  /** Resolves with the worker id once registered. */
  readonly ready: Promise<string>;
  /** Settles once the worker has stopped; rejects when it gave up (e.g. the token was refused). */
  readonly done: Promise<void>;
  /** Tasks whose handlers are running now. */
  readonly running: number;
  /**
   * Stops claiming, lets running handlers finish within the grace period,
   * releases the rest (with their checkpoints), then deregisters or drains.
   * Resolves like `done`.
   */
  stop(): Promise<void>;
}

/**
 * Options of createPushWorker: those of createWorker (but `pollSeconds`:
 * a push worker does not claim), and where it takes dispatches.
 */
export interface PushWorkerOptions extends Omit<WorkerOptions, "pollSeconds"> {
  /**
   * Where the receiver listens: `HOST:PORT`, `:PORT` or `PORT` (every
   * interface), `[::1]:PORT`; port 0 picks a free one. E.g. `127.0.0.1:0`.
   */
  listen: string;
  /**
   * The base URL the coordinator dispatches to, registered as
   * `api_base_url`; default `http://HOST:PORT` as bound (the host name of
   * this machine when listening on every interface). Give it when the
   * coordinator reaches the worker through another address (a proxy, a
   * container's published port, TLS in front).
   */
  apiBaseUrl?: string;
  /** The path dispatches are POSTed to, registered as `dispatch_path`; default `/meshwork/tasks`. */
  dispatchPath?: string;
  /**
   * The secret that signs dispatches (32–256 characters), registered as
   * `dispatch_secret`; default 32 random bytes in hex, new at each start.
   * Give a stable one only when something else must check signatures too.
   */
  dispatchSecret?: string;
  /** The largest dispatch body taken (a larger one is answered 413); default 8 MiB. */
  maxBodyBytes?: number;
}

/** A running push worker. */
export interface PushWorker extends Worker {
  /**
   * The receiver's own address as bound, `http://HOST:PORT` ("" until it
   * listens; `ready` resolves after that).
   */
  readonly listenUrl: string;
  /** The `api_base_url` registered ("" until it listens). */
  readonly apiBaseUrl: string;
}
