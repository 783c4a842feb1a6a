import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type Worker, WorkerSchema, WorkerState } from "../../gen/meshwork/v1/fleet_pb.js";
import type { Resources } from "../db/schema/index.js";
import { toQuantities } from "../tasks/convert.js";
import type { WorkerView } from "./store.js";

/** What a worker offers, `slots` (its max_concurrency; 0: no limit) included. */
export function capacityOf(w: Pick<WorkerView, "capacity" | "maxConcurrency">): Resources {
  return { ...w.capacity, slots: w.maxConcurrency };
}

export function toWorker(w: WorkerView): Worker {
  return create(WorkerSchema, {
    workerId: w.id,
    name: w.name,
    capabilities: w.capabilities,
    labels: w.labels,
    cpuCount: w.cpuCount,
    memoryMb: BigInt(w.memoryMb),
    apiBaseUrl: w.apiBaseUrl,
    peerId: w.peerId ?? "",
    maxConcurrency: w.maxConcurrency,
    drained: w.drained,
    state: w.lost ? WorkerState.LOST : WorkerState.ACTIVE,
    queueDepth: w.queueDepth,
    activeLeases: w.activeLeases,
    capacity: toQuantities(capacityOf(w)),
    allocated: toQuantities(w.allocated),
    reservedTaskId: w.reservedTaskId ?? "",
    registeredAt: timestampFromDate(w.registeredAt),
    lastHeartbeatAt: timestampFromDate(w.lastHeartbeatAt),
    dispatchPath: w.dispatchPath,
    // The secret itself is write-only.
    hasDispatchSecret: w.dispatchSecret !== null,
  });
}
