import type { Config } from "../config.js";
import { DomainError } from "../core/errors.js";
import type { Logger } from "../log.js";
import type { Metrics } from "../metrics/metrics.js";
import type { PlacementStore } from "../tasks/placement.js";
import { type AddressPolicy, createAddressPolicy, resolveAll } from "./dispatch-address.js";
import { type DispatchResult, sendDispatch } from "./dispatch-send.js";
import type { ClaimedDelivery, DispatchStore } from "./dispatch-store.js";

export interface DispatcherDeps {
  store: DispatchStore;
  placement: Pick<PlacementStore, "retry">;
  config: Pick<
    Config,
    "publicUrl" | "dispatchTimeoutMs" | "dispatchConcurrency" | "dispatchAllow" | "sweepIntervalMs"
  >;
  events: { emit(taskIds: Iterable<string>): void };
  log: Logger;
  metrics: Pick<Metrics, "dispatches" | "dispatchDuration">;
  /** Name resolution (tests replace it); default: every address of the name. */
  resolve?: (host: string) => Promise<{ address: string; family: number }[]>;
}

/** The wait before the n-th request again (n ≥ 1): 1 s × 2^(n−1), at most 30 s. */
export function backoffMs(tries: number): number {
  return Math.min(30_000, 1000 * 2 ** Math.max(0, tries - 1));
}

/**
 * Delivers placed tasks with dispatch to their workers (SPEC §14,
 * docs/protocol.md#push-placement), on every replica. Each pass claims due
 * deliveries in the database (dispatch-store.ts: one replica each, for
 * longer than a request), sends them, at most --dispatch-concurrency at
 * once, and records each outcome. An accepted delivery (2xx, 409) leaves
 * the task ASSIGNED until its worker's StartTask; a refusal (another 4xx)
 * or a forbidden address places the task again on another worker (a new
 * attempt: the old lease is fenced); a failure (5xx, a redirect, the
 * worker unreachable, a timeout) is sent again after a backoff while the
 * lease lasts, then placed elsewhere. Where no other worker fits, the task
 * is left to its lease's expiry and the retry rules.
 */
export function createDispatcher(deps: DispatcherDeps) {
  const { config } = deps;
  const policy: AddressPolicy = createAddressPolicy(config.dispatchAllow);
  const send = {
    coordinatorUrl: config.publicUrl,
    timeoutMs: config.dispatchTimeoutMs,
    policy,
    resolve: deps.resolve ?? resolveAll,
  };
  // Claimed longer than a request can take, with a margin for recording it.
  // A resolve and a request, each bounded by the timeout, and a margin.
  const holdMs = 2 * config.dispatchTimeoutMs + 5000;
  let inFlight = 0;
  const sending = new Set<Promise<void>>();
  let claiming: Promise<unknown> = Promise.resolve();
  let timer: NodeJS.Timeout | undefined;
  let started = false;

  async function deliver(d: ClaimedDelivery): Promise<void> {
    const result = await sendDispatch(d, send);
    deps.metrics.dispatches.inc({ outcome: result.outcome });
    deps.metrics.dispatchDuration.observe({ outcome: result.outcome }, result.durationMs / 1000);
    const ok = result.outcome === "accepted" || result.outcome === "duplicate";
    const transient = ["failed", "unreachable", "timeout"].includes(result.outcome);
    const row = await deps.store.record(
      d,
      result,
      ok ? "ACCEPTED" : "FAILED",
      transient ? backoffMs(d.tries + 1) : null,
    );
    deps.events.emit([d.taskId]);
    logOutcome(d, result);
    if (row?.state === "FAILED") await placeAgain(d, result);
  }

  function logOutcome(d: ClaimedDelivery, r: DispatchResult): void {
    // The secret and the lease token are never logged.
    const fields = {
      taskId: d.taskId,
      attempt: d.attempt,
      workerId: d.workerId,
      outcome: r.outcome,
      status: r.httpStatus,
      url: r.url,
      error: r.error,
    };
    if (r.outcome === "accepted" || r.outcome === "duplicate")
      deps.log.debug(fields, "task delivered");
    else deps.log.info(fields, "task delivery failed");
  }

  /** The task on another worker (RetryTask's placement, this worker excluded), while still this attempt. */
  async function placeAgain(d: ClaimedDelivery, r: DispatchResult): Promise<void> {
    try {
      const placed = await deps.placement.retry({
        taskId: d.taskId,
        key: "",
        correlationId: "",
        leaseSeconds: Math.min(86_400, Math.max(60, d.leaseSeconds)),
        redeliver: { attempt: d.attempt, workerId: d.workerId },
      });
      deps.events.emit([d.taskId]);
      deps.log.info(
        {
          taskId: d.taskId,
          from: d.workerId,
          to: placed.assignedWorkerId,
          attempt: placed.attempt,
          outcome: r.outcome,
        },
        "task placed again after a failed delivery",
      );
      kick();
    } catch (error) {
      if (!(error instanceof DomainError)) throw error;
      // No other worker fits now (or a limit holds it back): the attempt is
      // given back, PENDING again without counting against max_attempts,
      // rather than left holding its worker's slot until its lease expires.
      // One that moved on meanwhile (another attempt) is left as it is.
      const back = await deps.store.giveBack(
        d,
        `the delivery to worker ${d.workerId} failed (${r.outcome}${r.httpStatus ? ` ${r.httpStatus}` : ""}) and no other worker fits: ${error.message}`,
      );
      if (back) deps.events.emit([d.taskId]);
      deps.log.info(
        { taskId: d.taskId, reason: error.reason, givenBack: back },
        "task not placed again after a failed delivery",
      );
    }
  }

  /** Claims what the free slots allow and starts sending; resolves when those requests are recorded. */
  async function pass(): Promise<void> {
    const claim = claiming.then(async () => {
      const free = config.dispatchConcurrency - inFlight;
      if (free <= 0) return [];
      inFlight += free;
      try {
        const rows = await deps.store.claim(free, holdMs);
        inFlight -= free - rows.length;
        return rows;
      } catch (error) {
        inFlight -= free;
        throw error;
      }
    });
    claiming = claim.catch(() => {});
    const rows = await claim;
    const mine = rows.map((d) => {
      const p = deliver(d)
        .catch((error: unknown) =>
          deps.log.error({ err: error, taskId: d.taskId }, "delivery failed"),
        )
        .finally(() => {
          inFlight -= 1;
          sending.delete(p);
        });
      sending.add(p);
      return p;
    });
    await Promise.all(mine);
  }

  function kick(): void {
    if (!started) return;
    pass().catch((error: unknown) => deps.log.error({ err: error }, "dispatch pass failed"));
  }

  return {
    /** One pass now (tests call this instead of waiting): claims due deliveries, sends and records them. */
    runOnce: pass,
    /** A pass now, on a replica that runs the dispatcher (after a placement: delivery at once). */
    kick,
    start(): void {
      started = true;
      timer = setInterval(kick, config.sweepIntervalMs);
      timer.unref();
    },
    /** Stops passes of its own (runOnce still runs one); waits for the requests in flight to be recorded. */
    async stop(): Promise<void> {
      started = false;
      clearInterval(timer);
      await claiming;
      while (sending.size > 0) await Promise.all([...sending]);
    },
  };
}

export type Dispatcher = ReturnType<typeof createDispatcher>;
