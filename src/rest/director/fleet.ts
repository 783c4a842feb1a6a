import { type Worker, WorkerState } from "../../../gen/meshwork/v1/fleet_pb.js";
import { invalid } from "../../core/errors.js";
import type { PlainRoute } from "../../http/routes.js";
import { field } from "../body.js";
import { type DirectorRoute, iso, numbers, orNull, statusName } from "./session.js";

/** A worker as a fleet node. */
function nodeJson(w: Worker) {
  return {
    peerId: w.peerId || w.workerId,
    workerId: w.workerId,
    name: w.name,
    apiBaseUrl: w.apiBaseUrl,
    labels: w.labels,
    advertisedBrickIds: w.capabilities,
    drained: w.drained,
    state: w.state === WorkerState.LOST ? "Lost" : "Active",
    queueDepth: w.queueDepth,
    activeLeases: w.activeLeases,
    // null: no slot limit (a node registered without one).
    maxConcurrency: w.maxConcurrency === 0 ? null : w.maxConcurrency,
    cpuCount: w.cpuCount,
    memoryMb: Number(w.memoryMb),
    capacity: numbers(w.capacity),
    allocated: numbers(w.allocated),
    reservedTaskId: orNull(w.reservedTaskId),
    registeredUtc: iso(w.registeredAt),
    lastHeartbeatUtc: iso(w.lastHeartbeatAt),
  };
}

/** The fleet routes: nodes by peer id (register, read, remove, heartbeat, drain) and the fleet status. */
export function fleetRoutes(route: DirectorRoute): PlainRoute[] {
  return [
    route(["GET"], "/fleet/nodes", ["FleetService/ListWorkers"], "list fleet nodes", async (s) => {
      const nodes = [];
      let pageToken = "";
      do {
        const page = await s.fleet.listWorkers({ pageSize: 1000, pageToken });
        nodes.push(...page.workers.map(nodeJson));
        pageToken = page.nextPageToken;
      } while (pageToken !== "");
      return [200, nodes];
    }),

    route(
      ["POST"],
      "/fleet/nodes",
      ["FleetService/RegisterWorker"],
      "register a fleet node",
      async (s, _req) => {
        const body = await s.json([
          "peerId",
          "apiBaseUrl",
          "labels",
          "advertisedBrickIds",
          "drained",
          "name",
          "maxConcurrency",
          "cpuCount",
          "memoryMb",
          "capacity",
        ]);
        const peerId = field.string(body, "peerId");
        if (!peerId) throw invalid("peerId is required");
        const { worker } = await s.fleet.registerWorker({
          peerId,
          name: field.string(body, "name") ?? peerId,
          apiBaseUrl: field.string(body, "apiBaseUrl") ?? "",
          labels: field.stringMap(body, "labels") ?? {},
          capabilities: field.strings(body, "advertisedBrickIds") ?? [],
          // A node that states no maxConcurrency is placed greedily, with no
          // slot limit, as the director contract places (0: no limit).
          maxConcurrency: field.int(body, "maxConcurrency") ?? 0,
          cpuCount: field.int(body, "cpuCount") ?? 0,
          memoryMb: BigInt(field.int(body, "memoryMb") ?? 0),
          capacity: field.quantities(body, "capacity") ?? {},
        });
        if (!worker) throw new Error("RegisterWorker returned no worker");
        const drained = field.bool(body, "drained");
        if (drained === undefined || drained === worker.drained) return [200, nodeJson(worker)];
        const after = await s.fleet.drainWorker({ workerId: worker.workerId, drained });
        return [200, nodeJson(after.worker ?? worker)];
      },
    ),

    route(
      ["GET"],
      "/fleet/nodes/{id}",
      ["FleetService/GetWorker"],
      "read a fleet node",
      async (s, _req, match) => [200, nodeJson(await s.workerOf(peerIdOf(match)))],
    ),

    route(
      ["DELETE"],
      "/fleet/nodes/{id}",
      ["FleetService/DeregisterWorker"],
      "remove a fleet node",
      async (s, _req, match) => {
        const worker = await s.workerOf(peerIdOf(match));
        const { releasedTaskIds } = await s.fleet.deregisterWorker({ workerId: worker.workerId });
        return [200, { peerId: worker.peerId || worker.workerId, releasedTaskIds }];
      },
    ),

    route(
      ["POST"],
      "/fleet/nodes/{id}/heartbeat",
      ["FleetService/Heartbeat"],
      "heartbeat for a fleet node",
      async (s, _req, match) => {
        const body = await s.json(["queueDepth"], { optional: true });
        const worker = await s.workerOf(peerIdOf(match));
        const beat = await s.fleet.heartbeat({
          workerId: worker.workerId,
          queueDepth: field.int(body, "queueDepth"),
        });
        return [
          200,
          {
            peerId: worker.peerId || worker.workerId,
            drained: beat.drained,
            heartbeatIntervalSeconds: beat.heartbeatIntervalSeconds,
          },
        ];
      },
    ),

    route(
      ["POST"],
      "/fleet/nodes/{id}/drain",
      ["FleetService/DrainWorker"],
      "drain a fleet node",
      async (s, _req, match) => {
        const body = await s.json(["drained"], { optional: true });
        const worker = await s.workerOf(peerIdOf(match));
        const { worker: after } = await s.fleet.drainWorker({
          workerId: worker.workerId,
          drained: field.bool(body, "drained") ?? true,
        });
        return [200, nodeJson(after ?? worker)];
      },
    ),

    route(
      ["GET"],
      "/elastic/status",
      ["FleetService/GetFleetStatus"],
      "read the fleet status",
      async (s) => {
        const status = await s.fleet.getFleetStatus({});
        const taskCounts: Record<string, number> = {};
        for (const c of status.taskCounts) {
          const name = statusName[c.state];
          if (name) taskCounts[name] = Number(c.count);
        }
        return [
          200,
          {
            taskCounts,
            backlog: status.backlog.map((b) => ({
              workload: b.workload,
              pendingCount: Number(b.pendingCount),
              oldestCreatedUtc: iso(b.oldestCreatedAt),
              oldestAgeSeconds: b.oldestAge ? Number(b.oldestAge.seconds) : 0,
              pendingResources: numbers(b.pendingResources),
              workersNeeded: b.workersNeeded,
              workerCapacity: numbers(b.workerCapacity),
            })),
            workers: status.workers.map((w) => ({
              peerId: w.peerId || w.workerId,
              workerId: w.workerId,
              name: w.name,
              state: w.state === WorkerState.LOST ? "Lost" : "Active",
              drained: w.drained,
              queueDepth: w.queueDepth,
              activeLeases: w.activeLeases,
              // null for a node without a slot limit (maxConcurrency 0 in the RPCs).
              maxConcurrency: w.maxConcurrency === 0 ? null : w.maxConcurrency,
              freeSlots: w.maxConcurrency === 0 ? null : w.freeSlots,
              capacity: numbers(w.capacity),
              allocated: numbers(w.allocated),
            })),
          },
        ];
      },
    ),
  ];
}

/** The peer id in a route's path, percent-decoded. */
function peerIdOf(match: RegExpExecArray): string {
  try {
    return decodeURIComponent(match[1] ?? "");
  } catch {
    throw invalid("the peer id in the path is not valid percent-encoding");
  }
}
