/**
 * Why a parked claim was woken: for which workload, and the wake-up it
 * belongs to, with how many more parked claims all of its hand-ons together
 * may still wake.
 */
export interface Baton {
  workload: string;
  round: { left: number };
}

/** A wake-up armed before a claim, so that a notify between the claim and the wait is not lost. */
export interface Armed {
  /**
   * Resolves on the next notify that may concern this claim after arming
   * (with the baton of a counted wake-up), at the timeout, or on abort
   * (undefined then).
   */
  readonly fired: Promise<Baton | undefined>;
  /** Disarms (when the claim found work). */
  cancel(): void;
}

/** What a parked claim can take: the workloads it offers and how many tasks it asks for. */
export interface Claimer {
  capabilities: readonly string[];
  max: number;
}

interface Waiter {
  capabilities: ReadonlySet<string>;
  max: number;
  wake(baton: Baton | undefined): void;
}

/**
 * How many tasks became claimable, by workload, from a NOTIFY
 * meshwork_task_ready payload (`{"render":500}`, migration 0014); undefined
 * for an empty or unreadable one, which wakes every parked claim.
 */
export function readyCounts(payload: string | undefined): Map<string, number> | undefined {
  if (!payload) return undefined;
  try {
    const parsed = JSON.parse(payload) as unknown;
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return undefined;
    const counts = new Map<string, number>();
    for (const [workload, n] of Object.entries(parsed)) {
      if (typeof n === "number" && n > 0) counts.set(workload, n);
    }
    return counts;
  } catch {
    return undefined;
  }
}

/**
 * Wakes long-polling claimers. `notify(counts)` is called on NOTIFY
 * meshwork_task_ready (PostgreSQL: from any replica; PGlite: in-process)
 * and by the sweeper when retries fall due, with how many tasks of each
 * workload became claimable: for each workload, the parked claims that
 * offer it are woken oldest first until their `max_tasks` add up to the
 * count — a burst of 500 tasks wakes about 500 single-task claims, not
 * every one parked. Waiters never poll.
 *
 * A woken claim re-checks, and hands the wake-up on (`passOn`) to the next
 * parked claim of that workload when it found nothing (the task needed a
 * capability or label it lacks, or another replica took it). All the hand-ons of one wake-up
 * together wake at most as many claims as were parked for the workload and
 * not woken when it came, so a task no parked claim can take costs each of
 * them about one look, one after the other, never a loop. Without counts (`notify()`), every parked claim is woken.
 */
export function createClaimWakeups() {
  // Insertion-ordered: the longest-parked claim is woken first.
  const waiters = new Set<Waiter>();

  function eligible(workload: string): Waiter[] {
    const out: Waiter[] = [];
    for (const w of waiters) if (w.capabilities.has(workload)) out.push(w);
    return out;
  }

  return {
    notify(counts?: ReadonlyMap<string, number>): void {
      if (!counts) {
        const all = [...waiters];
        waiters.clear();
        for (const w of all) w.wake(undefined);
        return;
      }
      for (const [workload, count] of counts) {
        const candidates = eligible(workload);
        let left = count;
        let i = 0;
        for (; i < candidates.length && left > 0; i++) left -= (candidates[i] as Waiter).max;
        const woken = candidates.slice(0, i);
        const round = { left: candidates.length - woken.length };
        for (const w of woken) {
          waiters.delete(w);
          w.wake({ workload, round });
        }
      }
    },

    /** A woken claim found nothing: the next parked claim for the workload looks. */
    passOn(baton: Baton): void {
      if (baton.round.left <= 0) return;
      const [next] = eligible(baton.workload);
      if (!next) return;
      baton.round.left--;
      waiters.delete(next);
      next.wake(baton);
    },

    arm(ms: number, signal: AbortSignal, claimer: Claimer): Armed {
      let done: (baton?: Baton) => void = () => {};
      const fired = new Promise<Baton | undefined>((resolve) => {
        const waiter: Waiter = {
          capabilities: new Set(claimer.capabilities),
          max: Math.max(1, claimer.max),
          wake: (baton) => done(baton),
        };
        const onAbort = () => done(undefined);
        done = (baton?: Baton) => {
          clearTimeout(timer);
          waiters.delete(waiter);
          signal.removeEventListener("abort", onAbort);
          resolve(baton);
        };
        const timer = setTimeout(onAbort, Math.max(0, ms));
        waiters.add(waiter);
        if (signal.aborted) onAbort();
        else signal.addEventListener("abort", onAbort, { once: true });
      });
      return { fired, cancel: () => done(undefined) };
    },

    /** Claims parked now (tests, metrics). */
    parked(): number {
      return waiters.size;
    },
  };
}

export type ClaimWakeups = ReturnType<typeof createClaimWakeups>;
