import type { HeartbeatBuffer } from "../fleet/heartbeats.js";
import type { Logger } from "../log.js";
import type { Metrics } from "../metrics/metrics.js";
import type { TaskEvents } from "../tasks/events.js";
import type { LeaseStore } from "./store.js";
import type { ClaimWakeups } from "./wakeup.js";

export interface SweeperDeps {
  leases: LeaseStore;
  heartbeats: HeartbeatBuffer;
  events: TaskEvents;
  wakeups: ClaimWakeups;
  log: Logger;
  metrics: Pick<Metrics, "leaseExpiries" | "sweeperRuns" | "sweeperDuration">;
}

/**
 * How often the sweeper's lease expiry looks through every expired lease:
 * every this many milliseconds' worth of passes at its interval (a pass
 * skipped while the last still runs does not count).
 * Its other passes start at the mark of the last pass that left none behind
 * (leases/claim.ts, ExpirySweep): a lease expired before it and still there
 * (skipped while another transaction held its row, or moved into the past
 * by hand) waits for the next whole pass, at most this long.
 */
export const wholePassMs = 60_000;

/**
 * The once-a-second housekeeping every replica runs: writes buffered
 * heartbeats, returns expired leases to PENDING (or FAILED when attempts are
 * used up), fails the attempts past their timeout (TIMEOUT, as a retryable
 * failure), fails PENDING tasks past their deadline, and wakes claimers when
 * a retry's backoff has passed. Expiry and deadlines are each a
 * conditional UPDATE of rows a `SKIP LOCKED` select picked (leases/sql/),
 * safe beside other replicas and racing completions; the heartbeats are
 * one UPDATE of the buffered workers, and the retry wake-ups a read.
 */
export function createSweeper(deps: SweeperDeps, intervalMs: number) {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  let passes = 0;
  const wholePassEvery = Math.max(1, Math.round(wholePassMs / intervalMs));

  async function sweep(): Promise<void> {
    await deps.heartbeats.flush();
    // A whole pass once a minute, else from the mark of the last pass
    // that left none behind (leases/store.ts, expireLeases).
    const whole = passes % wholePassEvery === 0;
    passes += 1;
    const expired = await deps.leases.expireLeases(1000, !whole);
    for (const r of expired) {
      deps.metrics.leaseExpiries.inc({ outcome: r.state === "PENDING" ? "retry" : "failed" });
    }
    const timedOut = await deps.leases.timeoutAttempts(1000);
    const overdue = await deps.leases.failPastDeadline(1000);
    const changed = [...expired.map((r) => r.id), ...timedOut.map((r) => r.id), ...overdue];
    if (changed.length > 0) {
      deps.events.emit(changed);
      deps.log.info(
        { expired: expired.length, timedOut: timedOut.length, deadline: overdue.length },
        "sweeper moved tasks",
      );
    }
    // Tasks put back to PENDING wake parked claims through their update's
    // NOTIFY (migration 0014); a retry whose not_before passes changes no
    // row, so the sweeper wakes claims for those, counted by workload. The
    // window overlaps the previous sweep's: a spurious wake-up costs one
    // empty claim, a missed one a whole long poll.
    const due = await deps.leases.dueRetries(2 * intervalMs);
    if (due.size > 0) deps.wakeups.notify(due);
  }

  return {
    /** Runs one sweep now (tests call this instead of waiting). */
    async runOnce(): Promise<void> {
      while (running) await running;
      const end = deps.metrics.sweeperDuration.startTimer();
      running = sweep()
        .then(
          () => deps.metrics.sweeperRuns.inc({ result: "ok" }),
          (error: unknown) => {
            deps.metrics.sweeperRuns.inc({ result: "error" });
            throw error;
          },
        )
        .finally(() => {
          end();
          running = undefined;
        });
      return running;
    },
    start(): void {
      timer = setInterval(() => {
        if (running) return;
        this.runOnce().catch((error: unknown) => deps.log.error({ err: error }, "sweep failed"));
      }, intervalMs);
      timer.unref();
    },
    async stop(): Promise<void> {
      clearInterval(timer);
      while (running) await running.catch(() => {});
    },
  };
}

export type Sweeper = ReturnType<typeof createSweeper>;
