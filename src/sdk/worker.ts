import { createHash } from "node:crypto";
import { open, rm } from "node:fs/promises";
import { availableParallelism, freemem, hostname } from "node:os";
import type { JsonObject } from "@bufbuild/protobuf";
import {
  type Client,
  Code,
  ConnectError,
  createClient,
  type Interceptor,
  type Transport,
} from "@connectrpc/connect";
import { codeFromString } from "@connectrpc/connect/protocol-connect";
import {
  type Artifact,
  ArtifactKind,
  type ArtifactRef,
  ArtifactService,
  type UploadArtifactRequest,
} from "../../gen/meshwork/v1/artifact_pb.js";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import {
  type Claim,
  type CompleteTaskRequest,
  LeaseService,
} from "../../gen/meshwork/v1/lease_pb.js";
import { traceIdOf } from "../tracing/context.js";
import {
  createLeaseKeeper,
  type HeldLease,
  type LeaseEnd,
  type LeaseKeeper,
} from "./lease-keeper.js";
import {
  backoffMs,
  isLeaseRefusal,
  isTransient,
  reasonOf,
  retrying,
  sleep,
  workerTransport,
} from "./rpc.js";

export type { Artifact, ArtifactRef, Claim };

/**
 * The W3C trace headers of a call made for a claimed task: the claim's
 * `traceparent` and `tracestate`, so that the coordinator logs (and traces)
 * the call in the task's trace. None for a claim without one.
 */
export function traceHeaders(
  claim: Pick<Claim, "traceparent" | "tracestate">,
): Record<string, string> {
  const headers: Record<string, string> = {};
  if (claim.traceparent) headers.traceparent = claim.traceparent;
  if (claim.traceparent && claim.tracestate) headers.tracestate = claim.tracestate;
  return headers;
}

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
  /** Downloads the input and checks its SHA-256 (a TaskError when it has none or it differs). */
  input(): Promise<Uint8Array>;
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
}

/** What a handler returns to complete its task (all optional). */
export interface TaskResult {
  /** The result artifact: what `ctx.upload` returned. */
  result?: Pick<ArtifactRef, "artifactId" | "uri" | "sha256"> | undefined;
  /** A short description (≤ 4 KiB). */
  summary?: string | undefined;
  /** Numbers about the run. */
  metrics?: Record<string, number> | undefined;
}

/** Runs one task. Return to complete it; throw to fail it (see TaskError). */
export type TaskHandler = (task: WorkerTask, ctx: TaskContext) => HandlerReturn;

// biome-ignore lint/suspicious/noConfusingVoidType: an async handler that returns nothing is a Promise<void>
type HandlerReturn = Promise<TaskResult | undefined | void> | TaskResult | undefined | void;

/**
 * An error a handler throws to choose the FailTask `error_code` and whether
 * another attempt may help. Any other error fails the task as retryable with
 * its `code` (when a string) or its `name`; an error with `retryable: false`
 * is not retried either.
 */
export class TaskError extends Error {
  readonly code: string;
  readonly retryable: boolean;
  constructor(
    code: string,
    message: string,
    options: { retryable?: boolean; cause?: unknown } = {},
  ) {
    super(message, { cause: options.cause });
    this.name = "TaskError";
    this.code = code;
    this.retryable = options.retryable ?? true;
  }
}

/** The reason of an aborted `ctx.signal`: the lease was lost, the task cancelled, or released on stop. */
export class LeaseEndedError extends Error {
  readonly kind: "lost" | "canceled" | "released";
  /** The coordinator's reason (LEASE_EXPIRED, STALE_ATTEMPT, TASK_CANCELED, …) or SHUTDOWN. */
  readonly reason: string;
  constructor(kind: "lost" | "canceled" | "released", reason: string) {
    super(`task lease ${kind}${reason ? ` (${reason})` : ""}`);
    this.name = "LeaseEndedError";
    this.kind = kind;
    this.reason = reason;
  }
}

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
  /** Labels matched by task affinity. */
  labels?: Record<string, string>;
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

interface Running {
  claim: Claim;
  lease: HeldLease;
  abort: AbortController;
  checkpoint: string;
  /** The lease ended (lost, cancelled, released): nothing more is sent about it. */
  ended: boolean;
  /** The handler returned or threw: its completion or failure is being sent. */
  settled: boolean;
  finished: Promise<void>;
}

interface PendingCompletion {
  entry: Running;
  request: Omit<CompleteTaskRequest, "$typeName" | "result"> & { result?: ArtifactRef | undefined };
  settle: () => void;
}

const chunkBytes = 64 * 1024;

/**
 * Starts a worker at once: registers (max_concurrency = `concurrency`),
 * long-polls ClaimTasks for up to its free slots, and runs `handler` for
 * each task with its lease kept alive. A handler's return completes the task
 * (completions that finish together go in one CompleteTasks); a throw fails
 * it with FailTask. See WorkerOptions and TaskContext.
 */
export function createWorker(options: WorkerOptions): Worker {
  const log = options.log ?? ((m: string) => process.stderr.write(`meshwork worker: ${m}\n`));
  const concurrency = Math.max(1, Math.min(10_000, options.concurrency ?? 1));
  const pollSeconds = Math.max(0, Math.min(30, options.pollSeconds ?? 20));
  const graceMs = options.graceMs ?? 30_000;
  const batchMs = options.completionBatchMs ?? 20;
  const timeoutMs = options.callTimeoutMs ?? 30_000;
  const connectWithinMs = options.connectWithinMs ?? 10_000;
  const transport =
    options.transport ?? workerTransport(options.url, options.token, options.interceptors);
  const fleet = createClient(FleetService, transport);
  const leases: Client<typeof LeaseService> = createClient(LeaseService, transport);
  const artifacts = createClient(ArtifactService, transport);

  const stopping = new AbortController(); // stop claiming
  const hurry = new AbortController(); // skip what is left of the grace period
  const running = new Map<string, Running>();
  let slotFreed: (() => void) | undefined;
  let keeper: LeaseKeeper | undefined;
  let workerId = "";
  /** The coordinator no longer knows this worker: nothing to drain or deregister. */
  let gone = false;

  const ready = retrying(
    () =>
      fleet.registerWorker(
        {
          name: options.name ?? hostname(),
          capabilities: [...new Set([...options.workloads, ...(options.capabilities ?? [])])],
          labels: options.labels ?? {},
          maxConcurrency: concurrency,
          peerId: options.peerId ?? "",
          cpuCount: availableParallelism(),
          memoryMb: BigInt(Math.floor(freemem() / (1 << 20))),
        },
        // Not stopped mid-call: a registration the coordinator committed
        // must be answered, so that the stop that follows deregisters it.
        { timeoutMs },
      ),
    {
      signal: stopping.signal,
      tries: Number.POSITIVE_INFINITY,
      withinMs: connectWithinMs,
      onRetry: (error, attempt) => {
        if (attempt === 1) {
          log(
            `cannot reach the coordinator at ${options.url} (${(error as Error).message}); retrying for up to ${Math.round(connectWithinMs / 1000)} s`,
          );
        }
      },
    },
  )
    .then(
      (res) => res,
      (error: unknown) => {
        // A refusal (a bad token, say) is the coordinator's answer, as it is.
        if (!isTransient(error)) throw error;
        throw new Error(
          `could not register with the coordinator at ${options.url}: ${(error as Error).message}`,
          { cause: error },
        );
      },
    )
    .then((res) => {
      workerId = res.workerId;
      log(`registered as worker ${workerId} for ${options.workloads.join(", ")}`);
      if (res.worker?.drained) {
        log(
          `worker ${workerId} is drained (an operator drained it): it gets no tasks until undrained (meshwork worker undrain ${workerId})`,
        );
      }
      return workerId;
    });

  const endLease = (entry: Running, error: LeaseEndedError) => {
    if (entry.ended) return;
    entry.ended = true;
    keeper?.remove(entry.claim.taskId);
    entry.abort.abort(error);
  };

  /** Marks the lease ended when `error` is a lease refusal; rethrows it either way. */
  const underLease = async <T>(entry: Running, call: () => Promise<T>): Promise<T> => {
    try {
      return await call();
    } catch (error) {
      if (isLeaseRefusal(error)) {
        const reason = reasonOf(error);
        endLease(
          entry,
          new LeaseEndedError(reason === "TASK_CANCELED" ? "canceled" : "lost", reason),
        );
      }
      throw error;
    }
  };

  // Completions: gathered for completionBatchMs, then one CompleteTask or CompleteTasks.
  const pending: PendingCompletion[] = [];
  let flushTimer: NodeJS.Timeout | undefined;
  const flush = async () => {
    flushTimer = undefined;
    const batch = pending.splice(0, 1000);
    if (pending.length > 0) flushTimer = setTimeout(flush, 0);
    if (batch.length === 0) return;
    const settleAll = () => {
      for (const p of batch) p.settle();
    };
    try {
      if (batch.length === 1) {
        await completeAlone(batch[0] as PendingCompletion);
        return;
      }
      let res: Awaited<ReturnType<typeof leases.completeTasks>>;
      try {
        res = await retrying(
          () =>
            leases.completeTasks(
              { completions: batch.map((p) => p.request) },
              { timeoutMs, signal: hurry.signal },
            ),
          { signal: hurry.signal },
        );
      } catch (error) {
        if (isTransient(error)) throw error;
        // The batch as a whole was refused (a coordinator without
        // CompleteTasks, say): each completion goes alone, with its own answer.
        log(`CompleteTasks refused (${(error as Error).message}); completing one by one`);
        for (const p of batch) await completeAlone(p);
        return;
      }
      await Promise.all(
        batch.map(async (p, i) => {
          const outcome = res.results[i]?.outcome;
          if (outcome?.case === "task") {
            log(`task ${p.request.taskId} completed`);
            return;
          }
          // No answer for it: sent again alone (a completion is idempotent).
          if (outcome?.case !== "error") return completeAlone(p);
          // The same handling as a lone CompleteTask's error.
          const { code, reason, message } = outcome.value;
          const error = new ConnectError(
            message,
            codeFromString(code) ?? Code.Unknown,
            undefined,
            reason ? [{ desc: ErrorInfoSchema, value: { reason } }] : [],
          );
          if (isTransient(error)) return completeAlone(p); // with its retries
          if (isLeaseRefusal(error)) {
            endLease(
              p.entry,
              new LeaseEndedError(reason === "TASK_CANCELED" ? "canceled" : "lost", reason),
            );
          }
          await refused(p.entry, error);
        }),
      );
    } catch (error) {
      log(`completing ${batch.length} tasks failed: ${(error as Error).message}`);
    } finally {
      settleAll();
    }
  };
  /** One CompleteTask with its retries; a refusal fails the task or drops it when the lease is gone. */
  const completeAlone = async (p: PendingCompletion) => {
    try {
      await underLease(p.entry, () =>
        retrying(
          () =>
            leases.completeTask(p.request, {
              timeoutMs,
              signal: hurry.signal,
              headers: traceHeaders(p.entry.claim),
            }),
          { signal: hurry.signal },
        ),
      );
      log(`task ${p.request.taskId} completed`);
    } catch (error) {
      await refused(p.entry, error);
    }
  };
  const refused = async (entry: Running, error: unknown) => {
    if (entry.ended) {
      log(`task ${entry.claim.taskId}: the lease is gone (${reasonOf(error)}); completion dropped`);
      return;
    }
    log(`task ${entry.claim.taskId}: completion failed: ${(error as Error).message}`);
    if (!isTransient(error)) {
      // A result the coordinator finds invalid (a summary too long, too many
      // metrics) would be refused again: another attempt cannot help.
      const retryable = !(error instanceof ConnectError && error.code === Code.InvalidArgument);
      await fail(
        entry,
        new TaskError("CompletionRefused", (error as Error).message, { retryable }),
      );
    }
  };
  /**
   * Sends the progress reported since the last renewal, if any, before the
   * task completes: the lease keeper sends it with renewals, at most once a
   * second, so the last report of a task that ends soon after would be lost.
   */
  const flushProgress = async (entry: Running): Promise<void> => {
    const progress = entry.lease.progress;
    if (!progress) return;
    const { claim } = entry;
    try {
      await underLease(entry, () =>
        retrying(
          () =>
            leases.renewLease(
              {
                taskId: claim.taskId,
                workerId,
                attempt: claim.attempt,
                leaseToken: claim.leaseToken,
                progress,
              },
              { timeoutMs, signal: hurry.signal, headers: traceHeaders(claim) },
            ),
          { tries: 3, signal: hurry.signal },
        ),
      );
      if (entry.lease.progress === progress) entry.lease.progress = undefined;
    } catch (error) {
      log(`task ${claim.taskId}: its last progress was not sent: ${(error as Error).message}`);
    }
  };

  const complete = (entry: Running, result: TaskResult | undefined): Promise<void> => {
    const { claim } = entry;
    const ref = result?.result;
    return new Promise((settle) => {
      pending.push({
        entry,
        settle,
        request: {
          taskId: claim.taskId,
          workerId,
          attempt: claim.attempt,
          leaseToken: claim.leaseToken,
          result: ref && {
            $typeName: "meshwork.v1.ArtifactRef",
            artifactId: ref.artifactId,
            uri: ref.uri,
            sha256: ref.sha256,
            sizeBytes: 0n,
            contentType: "",
          },
          resultSummary: result?.summary ?? "",
          metrics: result?.metrics ?? {},
        },
      });
      flushTimer ??= setTimeout(flush, batchMs);
    });
  };

  const fail = async (entry: Running, error: unknown) => {
    const e = error as { code?: unknown; name?: unknown; message?: unknown; retryable?: unknown };
    const code =
      typeof e?.code === "string" && e.code !== ""
        ? e.code
        : typeof e?.name === "string" && e.name !== ""
          ? e.name
          : "Error";
    const message = typeof e?.message === "string" ? e.message : String(error);
    const retryable = e?.retryable !== false;
    try {
      await underLease(entry, () =>
        retrying(
          () =>
            leases.failTask(
              {
                taskId: entry.claim.taskId,
                workerId,
                attempt: entry.claim.attempt,
                leaseToken: entry.claim.leaseToken,
                errorCode: code.slice(0, 256),
                errorMessage: message,
                retryable,
              },
              { timeoutMs, signal: hurry.signal, headers: traceHeaders(entry.claim) },
            ),
          { signal: hurry.signal },
        ),
      );
      log(`task ${entry.claim.taskId} failed (${code}${retryable ? "" : ", not retryable"})`);
    } catch (failure) {
      log(
        `task ${entry.claim.taskId}: could not report its failure: ${(failure as Error).message}`,
      );
    }
  };

  const release = async (entry: Running) => {
    endLease(entry, new LeaseEndedError("released", "SHUTDOWN"));
    try {
      await retrying(
        () =>
          leases.releaseTask(
            {
              taskId: entry.claim.taskId,
              workerId,
              attempt: entry.claim.attempt,
              leaseToken: entry.claim.leaseToken,
              checkpointHandle: entry.checkpoint,
            },
            { timeoutMs, headers: traceHeaders(entry.claim) },
          ),
        { tries: 3 },
      );
      log(`task ${entry.claim.taskId} released${entry.checkpoint ? " with its checkpoint" : ""}`);
    } catch (error) {
      log(`task ${entry.claim.taskId}: release failed: ${(error as Error).message}`);
    }
  };

  const contextFor = (entry: Running, task: WorkerTask): TaskContext => ({
    parameters: task.parameters,
    traceparent: task.traceparent,
    traceId: task.traceId,
    signal: entry.abort.signal,
    input: () => inputBytes(entry),
    saveInput: (path) => saveInput(entry, path),
    upload: (name, body, uploadOptions) => upload(entry, name, body, uploadOptions),
    progress(completedSteps, message = "") {
      entry.lease.progress = { completedSteps, message };
    },
    checkpoint(handle) {
      entry.checkpoint = handle;
    },
  });

  /**
   * Streams the input to `sink` (started again from scratch after a
   * transient failure) and checks its SHA-256; resolves with its size.
   */
  const download = async (
    entry: Running,
    sink: { reset(): Promise<void>; write(chunk: Uint8Array): Promise<void> },
  ): Promise<number> => {
    const ref = entry.claim.input;
    if (!ref?.artifactId) {
      throw new TaskError("NoInput", "the task has no input", { retryable: false });
    }
    const { digest, size } = await retrying(
      async () => {
        await sink.reset();
        const hash = createHash("sha256");
        let size = 0;
        for await (const m of artifacts.downloadArtifact(
          { artifactId: ref.artifactId },
          { signal: entry.abort.signal, headers: traceHeaders(entry.claim) },
        )) {
          hash.update(m.chunk);
          size += m.chunk.byteLength;
          await sink.write(m.chunk);
        }
        return { digest: hash.digest("hex"), size };
      },
      { signal: entry.abort.signal },
    );
    if (digest !== ref.sha256.toLowerCase()) {
      throw new TaskError("InputChecksumMismatch", "the input's SHA-256 is not the claim's");
    }
    return size;
  };
  const inputBytes = async (entry: Running): Promise<Uint8Array> => {
    let chunks: Uint8Array[] = [];
    await download(entry, {
      reset: async () => {
        chunks = [];
      },
      write: async (chunk) => {
        chunks.push(chunk);
      },
    });
    const bytes = Buffer.concat(chunks);
    return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  };
  const saveInput = async (entry: Running, path: string): Promise<number> => {
    // Nothing is opened (so nothing already at `path` is touched) for a task
    // without input or a lease that has ended.
    if (!entry.claim.input?.artifactId) {
      throw new TaskError("NoInput", "the task has no input", { retryable: false });
    }
    entry.abort.signal.throwIfAborted();
    const file = await open(path, "w");
    let at = 0;
    let saved = false;
    try {
      const size = await download(entry, {
        reset: async () => {
          at = 0;
          await file.truncate(0);
        },
        write: async (chunk) => {
          await file.write(chunk, 0, chunk.byteLength, at);
          at += chunk.byteLength;
        },
      });
      saved = true;
      return size;
    } finally {
      await file.close();
      if (!saved) await rm(path, { force: true });
    }
  };

  const upload = (
    entry: Running,
    name: string,
    body: UploadBody,
    uploadOptions: UploadOptions = {},
  ): Promise<Artifact> => {
    const { claim } = entry;
    const whole = typeof body === "string" ? Buffer.from(body) : body;
    const header = {
      taskId: claim.taskId,
      workerId,
      attempt: claim.attempt,
      leaseToken: claim.leaseToken,
      filename: name,
      contentType: uploadOptions.contentType ?? "application/octet-stream",
      kind: uploadOptions.kind === "checkpoint" ? ArtifactKind.CHECKPOINT : ArtifactKind.OUTPUT,
      sha256: whole instanceof Uint8Array ? createHash("sha256").update(whole).digest("hex") : "",
      sizeBytes: whole instanceof Uint8Array ? BigInt(whole.byteLength) : undefined,
    };
    async function* messages(): AsyncGenerator<Omit<UploadArtifactRequest, "$typeName">> {
      yield {
        payload: {
          case: "header",
          value: { $typeName: "meshwork.v1.UploadArtifactHeader", ...header },
        },
      };
      if (whole instanceof Uint8Array) {
        for (let at = 0; at < whole.byteLength; at += chunkBytes) {
          yield { payload: { case: "chunk", value: whole.subarray(at, at + chunkBytes) } };
        }
        return;
      }
      for await (const chunk of whole) {
        const bytes = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
        for (let at = 0; at < bytes.byteLength; at += chunkBytes) {
          yield { payload: { case: "chunk", value: bytes.subarray(at, at + chunkBytes) } };
        }
      }
    }
    const once = async () => {
      const res = await artifacts.uploadArtifact(messages(), {
        signal: entry.abort.signal,
        headers: traceHeaders(claim),
      });
      if (!res.artifact) throw new Error("the coordinator answered no artifact");
      return res.artifact;
    };
    // Bytes can be sent again after a transient failure; a stream cannot.
    return underLease(entry, () =>
      whole instanceof Uint8Array ? retrying(once, { signal: entry.abort.signal }) : once(),
    );
  };

  const start = (claim: Claim) => {
    const now = performance.now();
    const ttlSeconds = claim.leaseSeconds || 60;
    const task: WorkerTask = {
      id: claim.taskId,
      attempt: claim.attempt,
      workload: claim.workload,
      name: claim.name,
      parameters: claim.parameters ?? {},
      input: claim.input?.artifactId ? claim.input : undefined,
      checkpoint: claim.checkpointHandle,
      correlationId: claim.correlationId,
      traceparent: claim.traceparent,
      traceId: traceIdOf(claim.traceparent),
      tracestate: claim.tracestate,
      steps: claim.steps,
      leaseSeconds: ttlSeconds,
    };
    const entry = {
      claim,
      abort: new AbortController(),
      checkpoint: "",
      ended: false,
      settled: false,
    } as Running;
    entry.lease = {
      taskId: claim.taskId,
      attempt: claim.attempt,
      leaseToken: claim.leaseToken,
      ttlSeconds,
      headers: traceHeaders(claim),
      expiresAt: now + ttlSeconds * 1000,
      renewAt: now + (ttlSeconds * 1000) / 3,
      onEnd: (end: LeaseEnd) => {
        log(`task ${claim.taskId}: lease ${end.kind} (${end.reason}); stopping its handler`);
        endLease(entry, new LeaseEndedError(end.kind, end.reason));
      },
    };
    running.set(claim.taskId, entry);
    keeper?.add(entry.lease);
    log(`claimed task ${claim.taskId} (attempt ${claim.attempt})`);
    entry.finished = (async () => {
      try {
        const result = await options.handler(task, contextFor(entry, task));
        entry.settled = true;
        if (!entry.ended) await flushProgress(entry);
        if (!entry.ended) await complete(entry, result ?? undefined);
      } catch (error) {
        entry.settled = true;
        if (!entry.ended) await fail(entry, error);
      } finally {
        keeper?.remove(claim.taskId);
        if (running.get(claim.taskId) === entry) running.delete(claim.taskId);
        slotFreed?.();
      }
    })();
  };

  const claimLoop = async () => {
    let failures = 0;
    while (!stopping.signal.aborted) {
      const free = concurrency - running.size;
      if (free <= 0) {
        const onStop = () => slotFreed?.();
        await new Promise<void>((resolve) => {
          slotFreed = resolve;
          stopping.signal.addEventListener("abort", onStop, { once: true });
        });
        // Removed at once: a worker at its cap waits here once per task.
        stopping.signal.removeEventListener("abort", onStop);
        slotFreed = undefined;
        continue;
      }
      const asked = performance.now();
      try {
        const res = await leases.claimTasks(
          {
            workerId,
            maxTasks: Math.min(free, 100),
            waitSeconds: pollSeconds,
            maxConcurrency: concurrency,
          },
          { signal: stopping.signal, timeoutMs: (pollSeconds + 30) * 1000 },
        );
        failures = 0;
        for (const claim of res.claims) start(claim);
        // Answered empty before the wait was over: drained, or at the cap by the
        // coordinator's count. Wait a little rather than asking again at once.
        if (res.claims.length === 0 && performance.now() - asked < (pollSeconds * 1000) / 2) {
          await sleep(1000, stopping.signal);
        }
      } catch (error) {
        if (stopping.signal.aborted) break;
        if (error instanceof ConnectError && error.code === Code.NotFound) {
          // Deregistered (by an operator, or the coordinator's data was reset):
          // its leases were released with it. Not registered again on its own,
          // which would undo the operator's choice: the worker stops.
          gone = true;
          throw new ConnectError(
            `worker ${workerId} is no longer registered (deregistered?); stopping`,
            Code.NotFound,
          );
        }
        if (!isTransient(error)) throw error;
        failures++;
        const delay = backoffMs(failures);
        log(`ClaimTasks failed (${(error as Error).message}); again in ${Math.round(delay)} ms`);
        await sleep(delay, stopping.signal);
      }
    }
  };

  const shutdown = async () => {
    if (!workerId) return;
    // With onStop "drain", drained at once, so that the fleet shows it
    // stopping and nothing is pushed to it meanwhile. Not when it is to be
    // deregistered: if that failed, a restart with the same peer_id would
    // find the worker drained, and take no work.
    const drained =
      gone || options.onStop !== "drain"
        ? Promise.resolve(false)
        : retrying(() => fleet.drainWorker({ workerId, drained: true }, { timeoutMs }), {
            tries: 3,
          }).then(
            () => true,
            (error: unknown) => {
              log(`could not drain worker ${workerId}: ${(error as Error).message}`);
              return false;
            },
          );
    if (running.size > 0) {
      log(`stopping: waiting up to ${graceMs} ms for ${running.size} running task(s)`);
      const all = Promise.all([...running.values()].map((r) => r.finished));
      const grace = new AbortController();
      const skip = () => grace.abort();
      hurry.signal.addEventListener("abort", skip, { once: true });
      await Promise.race([all, sleep(graceMs, grace.signal)]);
      grace.abort(); // no timer keeps the process alive once the tasks are done
      hurry.signal.removeEventListener("abort", skip);
    }
    // Past the grace: handlers still running lose their tasks; outcomes already
    // being sent are waited for (a second signal, `hurry`, cuts their calls).
    const left = [...running.values()];
    await Promise.all(left.filter((r) => !r.settled && !r.ended).map((r) => release(r)));
    if (flushTimer) {
      clearTimeout(flushTimer);
      await flush();
    }
    await Promise.all(left.filter((r) => r.settled).map((r) => r.finished));
    running.clear();
    await keeper?.stop();
    if (gone) return;
    try {
      if (options.onStop === "drain") {
        if (!(await drained)) {
          await retrying(() => fleet.drainWorker({ workerId, drained: true }, { timeoutMs }), {
            tries: 3,
          });
        }
        log(`worker ${workerId} drained`);
      } else {
        await retrying(() => fleet.deregisterWorker({ workerId }, { timeoutMs }), { tries: 3 });
        log(`worker ${workerId} deregistered`);
      }
    } catch (error) {
      log(
        `could not ${options.onStop ?? "deregister"} worker ${workerId}: ${(error as Error).message}`,
      );
    }
  };

  const done = (async () => {
    try {
      await ready;
    } catch (error) {
      if (stopping.signal.aborted) return;
      throw error;
    }
    keeper = createLeaseKeeper({
      client: leases,
      workerId,
      streams: options.leaseStreams ?? true,
      log,
    });
    let failure: unknown;
    try {
      await claimLoop();
    } catch (error) {
      failure = error;
      log(`giving up: ${(error as Error).message}`);
    }
    await shutdown();
    if (failure !== undefined) throw failure;
  })();
  ready.catch(() => {}); // reported through `done`

  const stop = () => {
    stopping.abort();
    return done;
  };

  if (options.installSignalHandlers ?? true) {
    const onSignal = (signal: NodeJS.Signals) => {
      if (!stopping.signal.aborted) {
        log(`${signal}: stopping (again to release running tasks at once)`);
        stop().catch(() => {});
      } else {
        log(`${signal} again: releasing running tasks now`);
        hurry.abort();
      }
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    const off = () => {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    };
    done.then(off, off);
  }

  return {
    ready,
    done,
    get running() {
      return running.size;
    },
    stop,
  };
}

/** Whether an error is the coordinator refusing the token (unauthenticated or permission_denied). */
export function isAuthError(error: unknown): boolean {
  return (
    error instanceof ConnectError &&
    (error.code === Code.Unauthenticated || error.code === Code.PermissionDenied)
  );
}
