import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type Worker, WorkerSchema, WorkerState } from "../../gen/meshwork/v1/fleet_pb.js";
import type { WorkerView } from "./store.js";

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
    registeredAt: timestampFromDate(w.registeredAt),
    lastHeartbeatAt: timestampFromDate(w.lastHeartbeatAt),
  });
}
