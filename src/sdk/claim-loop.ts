import { Code, ConnectError } from "@connectrpc/connect";
import type { Claim } from "../../gen/meshwork/v1/lease_pb.js";
import { backoffMs, isTransient, sleep } from "./rpc.js";
import type { Session } from "./session.js";

/**
 * Long-polls ClaimTasks for up to the free slots until the worker stops,
 * calling `start` for each task claimed; waits while every slot is taken.
 * Transient failures are retried after a backoff; it throws when the
 * coordinator no longer knows the worker or refuses it.
 */
export async function claimLoop(s: Session, start: (claim: Claim) => void): Promise<void> {
  const { stopping, pollSeconds, concurrency } = s;
  let failures = 0;
  while (!stopping.signal.aborted) {
    const free = concurrency - s.running.size;
    if (free <= 0) {
      const onStop = () => s.slotFreed?.();
      await new Promise<void>((resolve) => {
        s.slotFreed = resolve;
        stopping.signal.addEventListener("abort", onStop, { once: true });
      });
      // Removed at once: a worker at its cap waits here once per task.
      stopping.signal.removeEventListener("abort", onStop);
      s.slotFreed = undefined;
      continue;
    }
    const asked = performance.now();
    try {
      const res = await s.leases.claimTasks(
        {
          workerId: s.workerId,
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
        s.gone = true;
        throw new ConnectError(
          `worker ${s.workerId} is no longer registered (deregistered?); stopping`,
          Code.NotFound,
        );
      }
      if (!isTransient(error)) throw error;
      failures++;
      const delay = backoffMs(failures);
      s.log(`ClaimTasks failed (${(error as Error).message}); again in ${Math.round(delay)} ms`);
      await sleep(delay, stopping.signal);
    }
  }
}
