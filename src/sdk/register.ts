import { availableParallelism, freemem, hostname } from "node:os";
import { isTransient, retrying } from "./rpc.js";
import type { Session } from "./session.js";

/** Where a push worker takes dispatches (RegisterWorkerRequest's push fields). */
export interface PushRegistration {
  apiBaseUrl: string;
  dispatchPath: string;
  dispatchSecret: string;
}

/**
 * Registers the worker (max_concurrency = `concurrency`, its workloads and
 * capabilities, and for a push worker where it takes dispatches), trying a
 * coordinator it cannot reach for up to `connectWithinMs`; resolves with the
 * worker id, also set on the session with the heartbeat interval.
 */
export function register(s: Session, push?: PushRegistration): Promise<string> {
  const { options, log, timeoutMs, connectWithinMs } = s;
  return retrying(
    () =>
      s.fleet.registerWorker(
        {
          name: options.name ?? hostname(),
          capabilities: [...new Set([...options.workloads, ...(options.capabilities ?? [])])],
          labels: options.labels ?? {},
          maxConcurrency: s.concurrency,
          peerId: options.peerId ?? "",
          cpuCount: availableParallelism(),
          memoryMb: BigInt(Math.floor(freemem() / (1 << 20))),
          capacity: Object.fromEntries(
            Object.entries(options.capacity ?? {}).map(([k, v]) => [k, BigInt(v)]),
          ),
          ...push,
        },
        // Not stopped mid-call: a registration the coordinator committed
        // must be answered, so that the stop that follows deregisters it.
        { timeoutMs },
      ),
    {
      signal: s.stopping.signal,
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
      const workerId = res.workerId;
      s.workerId = workerId;
      s.heartbeatSeconds = res.heartbeatIntervalSeconds || 15;
      log(`registered as worker ${workerId} for ${options.workloads.join(", ")}`);
      if (res.worker?.drained) {
        log(
          `worker ${workerId} is drained (an operator drained it): it gets no tasks until undrained (meshwork worker undrain ${workerId})`,
        );
      }
      return workerId;
    });
}
