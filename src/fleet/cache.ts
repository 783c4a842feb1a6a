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
  // Reads of one worker made together (its streams and claims) share one query.
  const reading = new Map<string, Promise<WorkerView>>();
  return {
    async get(id: string): Promise<WorkerView> {
      const hit = entries.get(id);
      if (hit && Date.now() - hit.at < ttlMs) return hit.view;
      const pending = reading.get(id);
      if (pending) return pending;
      const read = fleet.get(id).finally(() => reading.delete(id));
      reading.set(id, read);
      const view = await read;
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
