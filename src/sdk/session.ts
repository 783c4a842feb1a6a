import { type Client, createClient } from "@connectrpc/connect";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { type Claim, LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { LeaseEndedError } from "./errors.js";
import type { HeldLease, LeaseKeeper } from "./lease-keeper.js";
import { createLogShipper, type LogShipper } from "./logs.js";
import { isLeaseRefusal, reasonOf, workerTransport } from "./rpc.js";
import type { WorkerOptions } from "./types.js";

/** One task whose handler runs on this worker. */
export interface Running {
  claim: Claim;
  lease: HeldLease;
  abort: AbortController;
  checkpoint: string;
  /** The lease ended (lost, cancelled, released): nothing more is sent about it. */
  ended: boolean;
  /** The handler returned or threw: its completion or failure is being sent. */
  settled: boolean;
  finished: Promise<void>;
}

/**
 * What the parts of a running worker share: its options with their
 * defaults, its clients, its two stop signals and the tasks it runs.
 */
export interface Session {
  options: WorkerOptions;
  log: (message: string) => void;
  concurrency: number;
  pollSeconds: number;
  graceMs: number;
  batchMs: number;
  /** The deadline of each call that is not a claim, an upload or a download (callTimeoutMs). */
  timeoutMs: number;
  connectWithinMs: number;
  fleet: Client<typeof FleetService>;
  leases: Client<typeof LeaseService>;
  artifacts: Client<typeof ArtifactService>;
  /** Aborted to stop claiming. */
  stopping: AbortController;
  /** Aborted to skip what is left of the grace period. */
  hurry: AbortController;
  running: Map<string, Running>;
  /** Called when a task ends, to wake a claim loop waiting for a free slot. */
  slotFreed: (() => void) | undefined;
  keeper: LeaseKeeper | undefined;
  /** The handlers' log lines, sent with AppendLogs (logs.ts). */
  logs: LogShipper;
  /** "" until registered. */
  workerId: string;
  /** How often the coordinator asks for a heartbeat (RegisterWorkerResponse), in seconds. */
  heartbeatSeconds: number;
  /** The coordinator no longer knows this worker: nothing to drain or deregister. */
  gone: boolean;
}

/** The session of a worker about to start: options defaulted and bounded, clients made. */
export function createSession(options: WorkerOptions): Session {
  const transport =
    options.transport ?? workerTransport(options.url, options.token, options.interceptors);
  const log = options.log ?? ((m: string) => process.stderr.write(`meshwork worker: ${m}\n`));
  const leases = createClient(LeaseService, transport);
  const timeoutMs = options.callTimeoutMs ?? 30_000;
  return {
    options,
    log,
    concurrency: Math.max(1, Math.min(10_000, options.concurrency ?? 1)),
    pollSeconds: Math.max(0, Math.min(30, options.pollSeconds ?? 20)),
    graceMs: options.graceMs ?? 30_000,
    batchMs: options.completionBatchMs ?? 20,
    timeoutMs,
    connectWithinMs: options.connectWithinMs ?? 10_000,
    fleet: createClient(FleetService, transport),
    leases,
    artifacts: createClient(ArtifactService, transport),
    stopping: new AbortController(),
    hurry: new AbortController(),
    running: new Map(),
    slotFreed: undefined,
    keeper: undefined,
    logs: createLogShipper({ client: leases, log, timeoutMs }),
    workerId: "",
    heartbeatSeconds: 15,
    gone: false,
  };
}

/** Ends a task's lease once: no more renewals, and its handler's signal aborts with `error`. */
export function endLease(s: Session, entry: Running, error: LeaseEndedError): void {
  if (entry.ended) return;
  entry.ended = true;
  s.keeper?.remove(entry.claim.taskId);
  entry.abort.abort(error);
}

/** The end of a lease the coordinator refused with `reason`: cancelled, or lost. */
export function refusedLease(reason: string): LeaseEndedError {
  return new LeaseEndedError(reason === "TASK_CANCELED" ? "canceled" : "lost", reason);
}

/** Marks the lease ended when `error` is a lease refusal; rethrows it either way. */
export async function underLease<T>(
  s: Session,
  entry: Running,
  call: () => Promise<T>,
): Promise<T> {
  try {
    return await call();
  } catch (error) {
    if (isLeaseRefusal(error)) endLease(s, entry, refusedLease(reasonOf(error)));
    throw error;
  }
}
