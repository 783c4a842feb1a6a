import { LeaseEndedError } from "./errors.js";
import { retrying } from "./rpc.js";
import { endLease, type Running, type Session, underLease } from "./session.js";
import { traceHeaders } from "./trace.js";

// What a worker tells the coordinator about a task besides its completion
// (completions.ts): its last progress, its failure, its release on stop.

/**
 * Sends the progress reported since the last renewal, if any, before the
 * task completes: the lease keeper sends it with renewals, at most once a
 * second, so the last report of a task that ends soon after would be lost.
 */
export async function flushProgress(s: Session, entry: Running): Promise<void> {
  const progress = entry.lease.progress;
  if (!progress) return;
  const { claim } = entry;
  try {
    await underLease(s, entry, () =>
      retrying(
        () =>
          s.leases.renewLease(
            {
              taskId: claim.taskId,
              workerId: s.workerId,
              attempt: claim.attempt,
              leaseToken: claim.leaseToken,
              progress,
            },
            { timeoutMs: s.timeoutMs, signal: s.hurry.signal, headers: traceHeaders(claim) },
          ),
        { tries: 3, signal: s.hurry.signal },
      ),
    );
    if (entry.lease.progress === progress) entry.lease.progress = undefined;
  } catch (error) {
    s.log(`task ${claim.taskId}: its last progress was not sent: ${(error as Error).message}`);
  }
}

/**
 * Fails the task with FailTask: the error's `code` (when a string) or its
 * `name` as the error_code, retryable unless it says `retryable: false`.
 */
export async function fail(s: Session, entry: Running, error: unknown): Promise<void> {
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
    await underLease(s, entry, () =>
      retrying(
        () =>
          s.leases.failTask(
            {
              taskId: entry.claim.taskId,
              workerId: s.workerId,
              attempt: entry.claim.attempt,
              leaseToken: entry.claim.leaseToken,
              errorCode: code.slice(0, 256),
              errorMessage: message,
              retryable,
            },
            { timeoutMs: s.timeoutMs, signal: s.hurry.signal, headers: traceHeaders(entry.claim) },
          ),
        { signal: s.hurry.signal },
      ),
    );
    s.log(`task ${entry.claim.taskId} failed (${code}${retryable ? "" : ", not retryable"})`);
  } catch (failure) {
    s.log(
      `task ${entry.claim.taskId}: could not report its failure: ${(failure as Error).message}`,
    );
  }
}

/** Gives the task back on stop (ReleaseTask, with its checkpoint); its handler's signal aborts. */
export async function release(s: Session, entry: Running): Promise<void> {
  endLease(s, entry, new LeaseEndedError("released", "SHUTDOWN"));
  try {
    await retrying(
      () =>
        s.leases.releaseTask(
          {
            taskId: entry.claim.taskId,
            workerId: s.workerId,
            attempt: entry.claim.attempt,
            leaseToken: entry.claim.leaseToken,
            checkpointHandle: entry.checkpoint,
          },
          { timeoutMs: s.timeoutMs, headers: traceHeaders(entry.claim) },
        ),
      { tries: 3 },
    );
    s.log(`task ${entry.claim.taskId} released${entry.checkpoint ? " with its checkpoint" : ""}`);
  } catch (error) {
    s.log(`task ${entry.claim.taskId}: release failed: ${(error as Error).message}`);
  }
}
