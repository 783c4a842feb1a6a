/**
 * In-process notice of task changes, for WatchTask. Every mutation made by
 * this replica emits the ids it changed; a watcher re-reads its task. Changes
 * made by another replica are picked up by the watcher's periodic re-read.
 */
export function createTaskEvents() {
  const watchers = new Map<string, Set<() => void>>();
  return {
    emit(ids: Iterable<string>): void {
      if (watchers.size === 0) return;
      for (const id of ids) for (const cb of watchers.get(id) ?? []) cb();
    },
    /** Calls `cb` after each change of the task; returns the unsubscribe. */
    subscribe(id: string, cb: () => void): () => void {
      const set = watchers.get(id) ?? new Set();
      watchers.set(id, set);
      set.add(cb);
      return () => {
        set.delete(cb);
        if (set.size === 0) watchers.delete(id);
      };
    },
  };
}

export type TaskEvents = ReturnType<typeof createTaskEvents>;
