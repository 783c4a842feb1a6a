import type { FleetStore, WorkerView } from "./store.js";

/**
 * The workers that claim, remembered for a moment so that a claim does not
 * read the worker first (its answer's free slots are one count after it). Only what a claim needs is taken from it (capabilities,
 * labels); whether the worker still exists and is not drained is checked
 * again inside the claim statement itself. This replica forgets a worker as
 * soon as it changes it; a change made through another replica is seen
 * within `ttlMs`.
 */
export function createWorkerCache(fleet: FleetStore, ttlMs = 1000) {
  const entries = new Map<string, { view: WorkerView; at: number }>();
  return {
    async get(id: string): Promise<WorkerView> {
      const hit = entries.get(id);
      if (hit && Date.now() - hit.at < ttlMs) return hit.view;
      const view = await fleet.get(id);
      if (entries.size > 100_000) entries.clear();
      entries.set(id, { view, at: Date.now() });
      return view;
    },
    forget(id: string): void {
      entries.delete(id);
    },
  };
}

export type WorkerCache = ReturnType<typeof createWorkerCache>;
