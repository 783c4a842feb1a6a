import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { type Claim, ClaimSchema } from "../../gen/meshwork/v1/lease_pb.js";
import type { Task } from "../../gen/meshwork/v1/task_pb.js";
import { createCompletions } from "./completions.js";
import type { DispatchBody } from "./dispatch.js";
import { LeaseEndedError } from "./errors.js";
import { createLeaseKeeper } from "./lease-keeper.js";
import { listenAddress, type PushServer, startPushServer, type Verdict } from "./push-server.js";
import { register } from "./register.js";
import { checkedUrl, isLeaseRefusal, isTransient, reasonOf, retrying, sleep } from "./rpc.js";
import { runTask } from "./run-task.js";
import { createSession, endLease } from "./session.js";
import { shutdown, stopOnSignals } from "./shutdown.js";
import { traceHeaders } from "./trace.js";
import type { PushWorker, PushWorkerOptions } from "./types.js";

// A push worker: the coordinator places tasks on it (ScheduleTask,
// RetryTask) and POSTs each to its api_base_url (docs/SPEC §14); it starts
// them with StartTask and runs them as a pull worker runs what it claims
// (run-task.ts, the lease keeper, completions, shutdown).

/** Where dispatches go unless the worker says otherwise (RegisterWorkerRequest.dispatch_path). */
export const defaultDispatchPath = "/meshwork/tasks";

/** The attempts of tasks that ended here, remembered to answer a late repeat 409. */
const rememberedAttempts = 1000;

/** A pushed task as the handler machinery takes it: the task StartTask returned, under the dispatch's lease. */
function claimOf(task: Task, d: DispatchBody): Claim {
  return create(ClaimSchema, {
    taskId: task.taskId,
    attempt: d.attempt,
    leaseToken: d.leaseToken,
    leaseExpiresAt: task.lease?.expiresAt,
    workload: task.workload,
    input: task.input,
    parameters: task.parameters,
    checkpointHandle: task.checkpointHandle,
    correlationId: task.correlationId,
    steps: task.steps,
    name: task.name,
    leaseSeconds: task.leaseSeconds,
    traceparent: task.traceparent,
    tracestate: task.tracestate,
    resources: task.resources,
    dependencyOutputs: task.dependencyOutputs,
    timeoutSeconds: task.timeoutSeconds,
  });
}

/** The api_base_url of a receiver bound to `host`:`port` when none was given. */
function defaultApiBaseUrl(host: string, port: number): string {
  const wildcard = host === "0.0.0.0" || host === "::";
  const name = wildcard ? hostname() : host;
  return `http://${name.includes(":") ? `[${name}]` : name}:${port}`;
}

/**
 * Starts a push worker at once: listens on `listen`, registers with its
 * `api_base_url`, `dispatch_path` and `dispatch_secret` (max_concurrency =
 * `concurrency`), and takes the tasks the coordinator dispatches to it.
 * Each request's X-Meshwork-Signature is checked first (a missing, wrong
 * or stale one: 401, nothing runs; a body over `maxBodyBytes`: 413); a
 * dispatch is then answered at once, 202 (accepted), 409 (an attempt it
 * already has), 429 (every slot taken: the coordinator tries again after a
 * backoff), 410 (stopping: the coordinator places the task elsewhere) or
 * 503 (not registered yet), and an accepted one is
 * started with StartTask under the dispatch's lease and run by `handler`
 * exactly as createWorker runs a claimed task: renewals, inputs, uploads,
 * logs, then CompleteTask or FailTask. While idle it heartbeats. `stop()`
 * drains as createWorker's does, then closes the receiver.
 */
export function createPushWorker(options: PushWorkerOptions): PushWorker {
  const secret = options.dispatchSecret ?? randomBytes(32).toString("hex");
  if (secret.length < 32 || secret.length > 256) {
    throw new TypeError("dispatchSecret must be 32–256 characters");
  }
  const dispatchPath = options.dispatchPath ?? defaultDispatchPath;
  if (!dispatchPath.startsWith("/")) throw new TypeError("dispatchPath must start with /");
  listenAddress(options.listen); // a bad address throws here, not in `done`
  if (options.apiBaseUrl !== undefined) checkedUrl(options.apiBaseUrl, "apiBaseUrl");
  const s = createSession({ ...options, pollSeconds: 0 });
  const { log, stopping } = s;
  const completions = createCompletions(s);
  /** Accepted, StartTask not yet answered: task id → attempt and the start. */
  const starting = new Map<string, { attempt: number; started: Promise<void> }>();
  /** `<task id>#<attempt>` of tasks started here, newest last. */
  const seen = new Set<string>();
  let server: PushServer | undefined;
  let apiBaseUrl = "";

  const remember = (key: string) => {
    seen.add(key);
    if (seen.size > rememberedAttempts) seen.delete(seen.values().next().value as string);
  };

  /** StartTask (ASSIGNED → RUNNING), then the task runs; a refused start drops it. */
  const start = async (d: DispatchBody) => {
    // A newer attempt of a task still running here: the old one is fenced
    // already (STALE_ATTEMPT); it stops before the new one takes its place.
    const old = s.running.get(d.taskId);
    if (old) {
      endLease(s, old, new LeaseEndedError("lost", "STALE_ATTEMPT"));
      await old.finished;
    }
    let task: Task | undefined;
    try {
      ({ task } = await retrying(
        () =>
          s.leases.startTask(
            {
              taskId: d.taskId,
              workerId: s.workerId,
              attempt: d.attempt,
              leaseToken: d.leaseToken,
            },
            {
              timeoutMs: s.timeoutMs,
              signal: s.hurry.signal,
              headers: traceHeaders({ ...d, tracestate: "" }),
            },
          ),
        { signal: s.hurry.signal },
      ));
    } catch (error) {
      const why = isLeaseRefusal(error) ? reasonOf(error) : (error as Error).message;
      log(`task ${d.taskId}: StartTask failed (${why}); not running it`);
      return;
    }
    if (!task) return;
    runTask(s, completions, claimOf(task, d), { renewAtOnce: true });
  };

  const accept = (d: DispatchBody): Verdict => {
    const key = `${d.taskId}#${d.attempt}`;
    const current = s.running.get(d.taskId)?.claim.attempt ?? starting.get(d.taskId)?.attempt;
    if (seen.has(key) || (current !== undefined && current >= d.attempt)) {
      return { status: 409, code: "already_accepted", message: `attempt ${d.attempt} is here` };
    }
    if (!s.workerId) return { status: 503, code: "not_registered", message: "not registered yet" };
    if (stopping.signal.aborted) {
      return { status: 410, code: "stopping", message: "this worker is stopping" };
    }
    const busy = new Set([...s.running.keys(), ...starting.keys()]);
    if (!busy.has(d.taskId) && busy.size >= s.concurrency) {
      return { status: 429, code: "at_capacity", message: `all ${s.concurrency} slots taken` };
    }
    remember(key);
    const started = start(d).finally(() => {
      if (starting.get(d.taskId)?.started === started) starting.delete(d.taskId);
    });
    starting.set(d.taskId, { attempt: d.attempt, started });
    log(`accepted task ${d.taskId} (attempt ${d.attempt})`);
    return { status: 202, code: "accepted", message: `task ${d.taskId} accepted` };
  };

  /** Heartbeats while the worker runs, so that an idle push worker is not LOST. */
  const heartbeats = async () => {
    let failures = 0;
    while (!stopping.signal.aborted) {
      await sleep(failures > 0 ? 1000 : s.heartbeatSeconds * 1000, stopping.signal);
      if (stopping.signal.aborted) return;
      try {
        await s.fleet.heartbeat({ workerId: s.workerId }, { timeoutMs: s.timeoutMs });
        failures = 0;
      } catch (error) {
        if (error instanceof ConnectError && error.code === Code.NotFound) {
          s.gone = true;
          throw new ConnectError(
            `worker ${s.workerId} is no longer registered (deregistered?); stopping`,
            Code.NotFound,
          );
        }
        if (!isTransient(error)) throw error;
        failures++;
        if (failures === 1) log(`Heartbeat failed (${(error as Error).message}); retrying`);
      }
    }
  };

  const ready = (async () => {
    server = await startPushServer({
      listen: options.listen,
      path: dispatchPath,
      secret,
      maxBodyBytes: options.maxBodyBytes ?? 8 << 20,
      accept,
      log,
    });
    apiBaseUrl = options.apiBaseUrl ?? defaultApiBaseUrl(server.host, server.port);
    log(`taking dispatches at ${server.url}${dispatchPath} (api_base_url ${apiBaseUrl})`);
    return register(s, { apiBaseUrl, dispatchPath, dispatchSecret: secret });
  })();

  const done = (async () => {
    let failure: unknown;
    try {
      await ready;
      s.keeper = createLeaseKeeper({
        client: s.leases,
        workerId: s.workerId,
        streams: options.leaseStreams ?? true,
        log,
      });
      await heartbeats();
    } catch (error) {
      if (!stopping.signal.aborted) {
        failure = error;
        log(`giving up: ${(error as Error).message}`);
        stopping.abort();
      }
    }
    await Promise.all([...starting.values()].map((st) => st.started));
    await shutdown(s, completions);
    await server?.close();
    if (failure !== undefined) throw failure;
  })();
  ready.catch(() => {}); // reported through `done`

  const stop = () => {
    stopping.abort();
    return done;
  };
  if (options.installSignalHandlers ?? true) stopOnSignals(s, stop, done);

  return {
    ready,
    done,
    get running() {
      return s.running.size;
    },
    get listenUrl() {
      return server?.url ?? "";
    },
    get apiBaseUrl() {
      return apiBaseUrl;
    },
    stop,
  };
}
