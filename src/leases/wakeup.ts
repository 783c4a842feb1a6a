/** A wake-up armed before a claim, so that a notify between the claim and the wait is not lost. */
export interface Armed {
  /** Resolves on the next notify after arming, at the timeout, or on abort. */
  readonly fired: Promise<void>;
  /** Disarms (when the claim found work). */
  cancel(): void;
}

/**
 * Wakes long-polling claimers. `notify()` is called on NOTIFY
 * meshwork_task_ready (PostgreSQL: from any replica; PGlite: in-process) and
 * by the sweeper when a retry's not_before passes. Waiters never poll.
 */
export function createClaimWakeups() {
  const waiters = new Set<() => void>();
  return {
    notify(): void {
      const all = [...waiters];
      waiters.clear();
      for (const wake of all) wake();
    },
    arm(ms: number, signal: AbortSignal): Armed {
      let done: () => void = () => {};
      const fired = new Promise<void>((resolve) => {
        done = () => {
          clearTimeout(timer);
          waiters.delete(done);
          signal.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, Math.max(0, ms));
        waiters.add(done);
        if (signal.aborted) done();
        else signal.addEventListener("abort", done, { once: true });
      });
      return { fired, cancel: done };
    },
  };
}

export type ClaimWakeups = ReturnType<typeof createClaimWakeups>;
