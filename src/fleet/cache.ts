import type { WorkerRow } from "../db/schema/index.js";
import type { FleetStore } from "./store.js";

/**
 * The workers that claim, remembered for a moment so that a claim does not
 * read the worker first (its answer's free slots are one count after it).
 * Only what a claim, a renewal or a completion needs is taken from it
 * (capabilities, labels, the cap, drained, the owner token): the row
 * alone, never the counts of its leases (FleetStore.row). Whether the
 * worker still exists and is not drained is checked again inside the
 * claim statement itself. This replica forgets a worker as soon as it
 * changes it; a change made through another replica is seen within
 * `ttlMs`.
 */
export function createWorkerCache(fleet: Pick<FleetStore, "row">, ttlMs = 1000) {
  const entries = new Map<string, { view: WorkerRow; at: number }>();
  // Reads of one worker made together (its streams and claims) share one query.
  const reading = new Map<string, Promise<WorkerRow>>();
  return {
    async get(id: string): Promise<WorkerRow> {
      const hit = entries.get(id);
      if (hit && Date.now() - hit.at < ttlMs) return hit.view;
      const pending = reading.get(id);
      if (pending) return pending;
      const read = fleet.row(id);
      reading.set(id, read);
      try {
        const view = await read;
        // Not kept when the worker was forgotten meanwhile: the row may be from before the change.
        if (reading.get(id) === read) {
          if (entries.size > 100_000) entries.clear();
          entries.set(id, { view, at: Date.now() });
        }
        return view;
      } finally {
        if (reading.get(id) === read) reading.delete(id);
      }
    },
    forget(id: string): void {
      entries.delete(id);
      reading.delete(id);
    },
  };
}

export type WorkerCache = ReturnType<typeof createWorkerCache>;
