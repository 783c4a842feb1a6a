import { createArtifactStore } from "./artifacts/store.js";
import { createTokenStore } from "./auth/token-store.js";
import type { Config } from "./config.js";
import type { Db, WithTx } from "./db/database.js";
import { createFleetStore } from "./fleet/store.js";
import { createKnowledgeStore } from "./knowledge/store.js";
import type { ClaimScheduling, ExpirySweep } from "./leases/claim.js";
import { createLeaseStore } from "./leases/store.js";
import { createScheduleStore } from "./schedules/store.js";
import { createSchedulingStore } from "./scheduling/store.js";
import { createPlacementStore } from "./tasks/placement.js";
import { createTaskStore } from "./tasks/store.js";

/**
 * Every store, bound to one database handle: the database itself, or one
 * transaction. `scheduling` (the share book) plans the claims made through
 * this handle's lease store.
 */
export function createStores(
  db: Db,
  config: Pick<Config, "heartbeatIntervalSeconds">,
  scheduling?: ClaimScheduling,
  sweep?: ExpirySweep,
) {
  return {
    fleet: createFleetStore(db, config.heartbeatIntervalSeconds),
    tasks: createTaskStore(db),
    leases: createLeaseStore(db, scheduling, sweep),
    scheduling: createSchedulingStore(db, config.heartbeatIntervalSeconds),
    artifacts: createArtifactStore(db),
    placement: createPlacementStore(db, config.heartbeatIntervalSeconds),
    knowledge: createKnowledgeStore(db),
    tokens: createTokenStore(db),
    schedules: createScheduleStore(db),
  };
}

export type Stores = ReturnType<typeof createStores>;

/** Runs a callback with every store bound to one transaction (see WithTx). */
export function createWithTx(
  db: Db,
  config: Pick<Config, "heartbeatIntervalSeconds">,
): WithTx<Stores> {
  return (fn) => db.transaction((tx) => fn(createStores(tx, config)));
}
