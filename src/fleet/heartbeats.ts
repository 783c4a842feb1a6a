import type { FleetStore } from "./store.js";

/**
 * Heartbeats implied by a worker's own calls (claims, renewals, stream
 * messages), gathered in memory and written once a second in one statement,
 * so that a busy worker does not pay an extra write per call. The explicit
 * Heartbeat RPC writes at once.
 */
export function createHeartbeatBuffer(fleet: FleetStore) {
  let pending = new Map<string, number | undefined>();
  return {
    touch(workerId: string, queueDepth?: number): void {
      if (queueDepth !== undefined || !pending.has(workerId)) pending.set(workerId, queueDepth);
    },
    async flush(): Promise<void> {
      if (pending.size === 0) return;
      const batch = pending;
      pending = new Map();
      await fleet.heartbeatMany(batch);
    },
  };
}

export type HeartbeatBuffer = ReturnType<typeof createHeartbeatBuffer>;
