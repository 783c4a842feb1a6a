import { create } from "@bufbuild/protobuf";
import { durationFromMs, durationMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  type FleetService,
  type RegisterWorkerRequest,
  TaskStateCountSchema,
  WorkerState,
} from "../../gen/meshwork/v1/fleet_pb.js";
import { callerOf, kAsker } from "../auth/principal.js";
import type { Config } from "../config.js";
import { invalid } from "../core/errors.js";
import { decodeCursor, pageSize } from "../core/paging.js";
import { workerCapacity } from "../core/scheduling.js";
import { allStates } from "../core/task-sql.js";
import { intInRange, isUuid, stringList, stringMap, text, uuidField } from "../core/validate.js";
import type { WithTx } from "../db/database.js";
import { type Demand, demandByWorkload, type Pool } from "../scheduling/demand.js";
import { toQuantities, toTaskState } from "../tasks/convert.js";
import type { TaskStore } from "../tasks/store.js";
import type { WorkerCache } from "./cache.js";
import { capacityOf, toWorker } from "./convert.js";
import {
  type AddressPolicy,
  createAddressPolicy,
  literalHost,
  plainAddress,
} from "./dispatch-address.js";
import type { FleetStore, WorkerInput } from "./store.js";

/** `/` then URL path characters. */
const dispatchPathPattern = /^\/[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*$/;

/**
 * The dispatch fields of a registration, checked (SPEC §14): the path, the
 * secret (write-only: undefined keeps the one set before), and an
 * api_base_url whose host is an IP literal --dispatch-allow forbids is
 * refused now (a name is resolved and checked at each dispatch).
 */
function dispatchInput(
  req: RegisterWorkerRequest,
  policy: AddressPolicy,
  registeredFrom: string,
): Pick<WorkerInput, "dispatchPath" | "dispatchSecret" | "registeredFrom"> {
  const path = req.dispatchPath === "" ? "/meshwork/tasks" : req.dispatchPath;
  if (path.length > 256 || !dispatchPathPattern.test(path)) {
    throw invalid("dispatch_path must be / then URL path characters, at most 256");
  }
  const secret = req.dispatchSecret;
  if (secret !== "" && (secret.length < 32 || secret.length > 256)) {
    // Never repeated in the message.
    throw invalid("dispatch_secret must be 32 to 256 characters");
  }
  // Refused at once only for a worker that asks for dispatches (a path or a
  // secret): a director's nodes and pull workers have long registered
  // private addresses they are never sent to. Every dispatch checks again.
  if (req.apiBaseUrl !== "" && (req.dispatchPath !== "" || secret !== "")) {
    const ip = literalHost(new URL(req.apiBaseUrl));
    if (ip !== undefined && !policy.allows(ip, registeredFrom)) {
      throw invalid(
        `api_base_url ${ip} is a private, loopback or link-local address that --dispatch-allow does not allow`,
      );
    }
  }
  return {
    // Both kept from an earlier registration when not given again.
    dispatchPath: req.dispatchPath === "" ? undefined : path,
    dispatchSecret: secret === "" ? undefined : secret,
    registeredFrom,
  };
}

function workerInput(req: RegisterWorkerRequest): WorkerInput {
  if (req.apiBaseUrl !== "") {
    let url: URL;
    try {
      url = new URL(req.apiBaseUrl);
    } catch {
      throw invalid("api_base_url must be an absolute http(s) URL");
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw invalid("api_base_url must be an absolute http(s) URL");
    }
    if (req.apiBaseUrl.length > 2048) throw invalid("api_base_url is longer than 2048 characters");
  }
  const memoryMb = Number(req.memoryMb);
  if (memoryMb < 0 || !Number.isSafeInteger(memoryMb))
    throw invalid("memory_mb must not be negative");
  const cpuCount = intInRange("cpu_count", req.cpuCount, 0, 1_000_000);
  const maxConcurrency =
    req.maxConcurrency === undefined
      ? undefined
      : intInRange("max_concurrency", req.maxConcurrency, 0, 10_000);
  const { capacity, slots } = workerCapacity("capacity", req.capacity, cpuCount, memoryMb);
  if (slots !== undefined) {
    intInRange("capacity[slots]", slots, 0, 10_000);
    if (maxConcurrency !== undefined && maxConcurrency !== slots) {
      throw invalid(
        `capacity[slots] (${slots}) and max_concurrency (${maxConcurrency}) are the same thing: give one, or the same value`,
      );
    }
  }
  return {
    name: text("name", req.name, { optional: true }),
    capabilities: stringList("capabilities", req.capabilities, 1000),
    labels: stringMap("labels", req.labels),
    cpuCount,
    memoryMb,
    apiBaseUrl: req.apiBaseUrl,
    maxConcurrency: maxConcurrency ?? slots,
    capacity,
    peerId: req.peerId === "" ? undefined : peerIdField("peer_id", req.peerId),
  };
}

const peerIdPattern = /^[A-Za-z0-9._:@~+-]{1,256}$/;

/** A peer id names a worker in URL paths: 1–256 of `A–Z a–z 0–9 . _ : @ ~ + -`. */
export function peerIdField(field: string, value: string): string {
  if (isUuid(value)) {
    // A worker registered without a peer_id answers to its worker_id as a
    // peer id: a peer_id shaped like a UUID could pass for another worker.
    throw invalid(`${field} must not be a UUID (worker ids answer to those)`);
  }
  if (!peerIdPattern.test(value)) {
    throw invalid(
      `${field} must be 1 to 256 characters of A-Z a-z 0-9 . _ : @ ~ + -, not ${JSON.stringify(value.slice(0, 64))}`,
    );
  }
  return value;
}

/** What FleetService uses. */
export interface FleetServiceDeps {
  config: Pick<Config, "heartbeatIntervalSeconds" | "workerRetentionMs" | "dispatchAllow">;
  fleet: FleetStore;
  tasks: Pick<TaskStore, "countByState" | "backlog">;
  /**
   * The stores on the database's urgent lane (db/pool-gate.ts): the fleet's
   * status is read there, so that an operator sees it during a burst that
   * holds the rest of the pool.
   */
  urgent: {
    fleet: Pick<FleetStore, "all">;
    tasks: Pick<TaskStore, "countByState" | "backlog" | "pendingResources">;
  };
  /** What a pool of work needs (scheduling/demand.ts): the backlog's workers_needed. */
  demand(pool: Pool): Promise<Demand>;
  workerCache: Pick<WorkerCache, "forget">;
  events: { emit(taskIds: Iterable<string>): void };
  withTx: WithTx<{
    fleet: Pick<FleetStore, "remove">;
    leases: { releaseWorker(workerId: string): Promise<string[]> };
  }>;
}

/** FleetService: the worker registry and the fleet's status. */
export function createFleetService(app: FleetServiceDeps): ServiceImpl<typeof FleetService> {
  const interval = app.config.heartbeatIntervalSeconds;
  const policy = createAddressPolicy(app.config.dispatchAllow);
  return {
    async registerWorker(req, ctx) {
      const from = ctx.values.get(kAsker)?.address;
      const input = {
        ...workerInput(req),
        ...dispatchInput(req, policy, from ? plainAddress(from) : ""),
      };
      if (req.workerId !== "" && input.peerId !== undefined) {
        throw invalid("give worker_id or peer_id, not both");
      }
      const principal = callerOf(ctx.values);
      const worker = await app.fleet.register(
        input,
        req.workerId === "" ? undefined : uuidField("worker_id", req.workerId),
        principal.tokenId,
        // A worker token updates only its own workers (by worker_id, the auth
        // interceptor checks that before the call; by peer_id, the store).
        { mayUpdateAny: principal.role !== "worker" },
      );
      app.workerCache.forget(worker.id);
      return { workerId: worker.id, heartbeatIntervalSeconds: interval, worker: toWorker(worker) };
    },

    async getWorker(req) {
      if (req.peerId !== "") {
        if (req.workerId !== "") throw invalid("give worker_id or peer_id, not both");
        return { worker: toWorker(await app.fleet.getByPeer(text("peer_id", req.peerId))) };
      }
      return { worker: toWorker(await app.fleet.get(uuidField("worker_id", req.workerId))) };
    },

    async listWorkers(req) {
      if (req.state !== WorkerState.UNSPECIFIED && !(req.state in WorkerState)) {
        throw invalid(`state ${req.state} is not a worker state`);
      }
      const page = await app.fleet.list(
        {
          capability: req.capability === "" ? undefined : text("capability", req.capability),
          labels: stringMap("label_selector", req.labelSelector),
          lost: req.state === WorkerState.UNSPECIFIED ? undefined : req.state === WorkerState.LOST,
          drained: req.drained,
        },
        pageSize(req.pageSize),
        decodeCursor(req.pageToken),
      );
      return { workers: page.rows.map(toWorker), nextPageToken: page.next };
    },

    async heartbeat(req) {
      const id = uuidField("worker_id", req.workerId);
      const depth =
        req.queueDepth === undefined
          ? undefined
          : intInRange("queue_depth", req.queueDepth, 0, 2_000_000_000);
      const { drained } = await app.fleet.heartbeat(id, depth);
      return { heartbeatIntervalSeconds: interval, drained };
    },

    async drainWorker(req) {
      const worker = await app.fleet.drain(uuidField("worker_id", req.workerId), req.drained);
      app.workerCache.forget(worker.id);
      return { worker: toWorker(worker) };
    },

    async deregisterWorker(req) {
      const id = uuidField("worker_id", req.workerId);
      await app.fleet.get(id);
      // Release and removal commit together: no lease outlives its worker.
      const released = await app.withTx(async (tx) => {
        const ids = await tx.leases.releaseWorker(id);
        await tx.fleet.remove(id);
        return ids;
      });
      app.workerCache.forget(id);
      app.events.emit(released);
      return { releasedTaskIds: released };
    },

    async pruneWorkers(req) {
      let lostForMs = app.config.workerRetentionMs > 0 ? app.config.workerRetentionMs : 86_400_000;
      if (req.lostFor) {
        lostForMs = durationMs(req.lostFor);
        if (!(lostForMs >= 1000 && lostForMs <= 100 * 365 * 86_400_000)) {
          throw invalid("lost_for must be from 1 s to 100 years");
        }
      }
      return { count: await app.fleet.pruneLost(lostForMs / 1000, req.dryRun) };
    },

    async getFleetStatus() {
      const [counts, backlog, workers, asked] = await Promise.all([
        app.urgent.tasks.countByState(),
        app.urgent.tasks.backlog(),
        app.urgent.fleet.all(),
        app.urgent.tasks.pendingResources(),
      ]);
      const demand = await demandByWorkload(
        backlog.map((b) => b.workload),
        workers.map((w) => ({ ...w, capacity: capacityOf(w) })),
        app.demand,
      );
      return {
        taskCounts: allStates.map((s) =>
          create(TaskStateCountSchema, {
            state: toTaskState(s),
            count: BigInt(counts.get(s) ?? 0),
          }),
        ),
        backlog: backlog.map((b) => ({
          workload: b.workload,
          pendingCount: BigInt(b.count),
          oldestCreatedAt: timestampFromDate(b.oldest),
          oldestAge: durationFromMs(Math.max(0, b.now.getTime() - b.oldest.getTime())),
          pendingResources: toQuantities(asked.get(b.workload) ?? {}),
          workersNeeded: demand.get(b.workload)?.workersNeeded ?? 0,
          workerCapacity: toQuantities(demand.get(b.workload)?.capacity ?? {}),
        })),
        workers: workers.map((w) => ({
          workerId: w.id,
          peerId: w.peerId ?? "",
          name: w.name,
          state: w.lost ? WorkerState.LOST : WorkerState.ACTIVE,
          drained: w.drained,
          queueDepth: w.queueDepth,
          activeLeases: w.activeLeases,
          maxConcurrency: w.maxConcurrency,
          freeSlots:
            w.maxConcurrency === 0 ? 0 : Math.max(0, w.maxConcurrency - (w.allocated.slots ?? 0)),
          capacity: toQuantities(capacityOf(w)),
          allocated: toQuantities(w.allocated),
        })),
      };
    },
  };
}
