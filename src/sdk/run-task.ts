import type { Claim } from "../../gen/meshwork/v1/lease_pb.js";
import { type Completions, checkedValue } from "./completions.js";
import { LeaseEndedError } from "./errors.js";
import { inputBytes, saveInput } from "./input.js";
import { namedInputs } from "./inputs.js";
import type { LeaseEnd } from "./lease-keeper.js";
import { fail, flushProgress } from "./report.js";
import { endLease, type Running, type Session } from "./session.js";
import { traceHeaders, traceIdOf } from "./trace.js";
import type { TaskContext, WorkerTask } from "./types.js";
import { upload } from "./upload.js";

/** A claim as the handler sees it. */
function taskOf(claim: Claim, leaseSeconds: number): WorkerTask {
  return {
    id: claim.taskId,
    attempt: claim.attempt,
    workload: claim.workload,
    name: claim.name,
    parameters: claim.parameters ?? {},
    input: claim.input?.artifactId ? claim.input : undefined,
    dependencyOutputs: { ...claim.dependencyOutputs },
    timeoutSeconds: claim.timeoutSeconds,
    checkpoint: claim.checkpointHandle,
    correlationId: claim.correlationId,
    traceparent: claim.traceparent,
    traceId: traceIdOf(claim.traceparent),
    tracestate: claim.tracestate,
    steps: claim.steps,
    leaseSeconds,
    resources: Object.fromEntries(Object.entries(claim.resources).map(([k, v]) => [k, Number(v)])),
  };
}

function contextFor(s: Session, entry: Running, task: WorkerTask): TaskContext {
  return {
    parameters: task.parameters,
    traceparent: task.traceparent,
    traceId: task.traceId,
    signal: entry.abort.signal,
    timeoutSeconds: task.timeoutSeconds,
    input: () => inputBytes(s, entry),
    inputs: namedInputs(s, entry),
    saveInput: (path) => saveInput(s, entry, path),
    upload: (name, body, uploadOptions) => upload(s, entry, name, body, uploadOptions),
    progress(completedSteps, message = "") {
      entry.lease.progress = { completedSteps, message };
    },
    checkpoint(handle) {
      entry.checkpoint = handle;
    },
    log(text, stream = "log") {
      if (entry.ended) return;
      s.logs.write(
        {
          taskId: task.id,
          attempt: task.attempt,
          workerId: s.workerId,
          leaseToken: entry.claim.leaseToken,
        },
        stream,
        text,
      );
    },
  };
}

/**
 * Runs one claimed task: its lease is handed to the keeper, its handler
 * called; the handler's return completes the task (after its last
 * progress), a throw fails it, and nothing is sent once the lease ended.
 * The task leaves `s.running` when it is done, freeing its slot. A pushed
 * task (`renewAtOnce`) has its lease renewed at once: it was granted at
 * placement, some time before it arrived, so its TTL is not all left.
 */
export function runTask(
  s: Session,
  completions: Completions,
  claim: Claim,
  { renewAtOnce = false } = {},
): void {
  const { log } = s;
  const now = performance.now();
  const ttlSeconds = claim.leaseSeconds || 60;
  const task = taskOf(claim, ttlSeconds);
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
    renewAt: renewAtOnce ? now : now + (ttlSeconds * 1000) / 3,
    onEnd: (end: LeaseEnd) => {
      log(`task ${claim.taskId}: lease ${end.kind} (${end.reason}); stopping its handler`);
      endLease(s, entry, new LeaseEndedError(end.kind, end.reason));
    },
  };
  s.running.set(claim.taskId, entry);
  s.keeper?.add(entry.lease);
  log(`${renewAtOnce ? "started" : "claimed"} task ${claim.taskId} (attempt ${claim.attempt})`);
  entry.finished = (async () => {
    try {
      const result = await s.options.handler(task, contextFor(s, entry, task));
      entry.settled = true;
      // A value that cannot be sent fails the task (the catch below).
      const value = checkedValue(result?.value);
      // Lines are taken only under a live lease: sent before the completion.
      if (!entry.ended) await s.logs.flush();
      if (!entry.ended) await flushProgress(s, entry);
      if (!entry.ended)
        await completions.complete(entry, result ? { ...result, value } : undefined);
    } catch (error) {
      entry.settled = true;
      if (!entry.ended) await s.logs.flush();
      if (!entry.ended) await fail(s, entry, error);
    } finally {
      s.keeper?.remove(claim.taskId);
      if (s.running.get(claim.taskId) === entry) s.running.delete(claim.taskId);
      s.slotFreed?.();
    }
  })();
}
