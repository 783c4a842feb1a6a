import type { Artifact, ArtifactRef } from "../../gen/meshwork/v1/artifact_pb.js";
import type { Claim } from "../../gen/meshwork/v1/lease_pb.js";
import { claimLoop } from "./claim-loop.js";
import { createCompletions } from "./completions.js";
import { createLeaseKeeper } from "./lease-keeper.js";
import { register } from "./register.js";
import { runTask } from "./run-task.js";
import { createSession } from "./session.js";
import { shutdown, stopOnSignals } from "./shutdown.js";
import type { Worker, WorkerOptions } from "./types.js";

// The worker SDK (meshwork/worker): this file is its public API. Its parts,
// each with one job: session.ts (options, clients, shared state, lease
// ends), register.ts, claim-loop.ts, run-task.ts (one task and its
// context), input.ts, inputs.ts and upload.ts (bytes under a lease),
// completions.ts (batched CompleteTasks, result values), report.ts
// (progress, failure, release), shutdown.ts, lease-keeper.ts (renewals),
// rpc.ts (transport, retries), trace.ts; for a push worker, push-worker.ts
// (createPushWorker), push-server.ts (its HTTP receiver) and dispatch.ts
// (the dispatch body and its signature). It imports only gen/ and npm
// packages, never the coordinator.

export {
  checkDispatchSignature,
  type DispatchBody,
  signatureHeader,
  signatureToleranceSeconds,
  signDispatch,
} from "./dispatch.js";
export { isAuthError, LeaseEndedError, TaskError } from "./errors.js";
export { createPushWorker, defaultDispatchPath } from "./push-worker.js";
export { traceHeaders } from "./trace.js";
export type {
  NamedInput,
  PushWorker,
  PushWorkerOptions,
  TaskContext,
  TaskHandler,
  TaskResult,
  UploadBody,
  UploadOptions,
  Worker,
  WorkerOptions,
  WorkerTask,
} from "./types.js";
export type { Artifact, ArtifactRef, Claim };

/**
 * Starts a worker at once: registers (max_concurrency = `concurrency`),
 * long-polls ClaimTasks for up to its free slots, and runs `handler` for
 * each task with its lease kept alive. A handler's return completes the task
 * (completions that finish together go in one CompleteTasks); a throw fails
 * it with FailTask. See WorkerOptions and TaskContext.
 */
export function createWorker(options: WorkerOptions): Worker {
  const s = createSession(options);
  const { log, stopping } = s;
  const completions = createCompletions(s);
  const ready = register(s);

  const done = (async () => {
    try {
      await ready;
    } catch (error) {
      if (stopping.signal.aborted) return;
      throw error;
    }
    s.keeper = createLeaseKeeper({
      client: s.leases,
      workerId: s.workerId,
      streams: options.leaseStreams ?? true,
      log,
    });
    let failure: unknown;
    try {
      await claimLoop(s, (claim) => runTask(s, completions, claim));
    } catch (error) {
      failure = error;
      log(`giving up: ${(error as Error).message}`);
    }
    await shutdown(s, completions);
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
    stop,
  };
}
