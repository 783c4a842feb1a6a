import { create } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError } from "@connectrpc/connect";
import {
  type LeaseService,
  LeaseStatus,
  type LeaseUpdate,
  type StreamLeasesRequest,
  StreamLeasesRequestSchema,
  type StreamLeasesResponse,
} from "../../gen/meshwork/v1/lease_pb.js";
import { backoffMs, isLeaseRefusal, isTransient, Outbox, reasonOf, sleep } from "./rpc.js";

/** Why a lease ended under the handler: lost (with the coordinator's reason) or cancelled. */
export interface LeaseEnd {
  kind: "lost" | "canceled";
  reason: string;
}

/** One lease the keeper renews until it is removed or ends. */
export interface HeldLease {
  taskId: string;
  attempt: number;
  leaseToken: string;
  ttlSeconds: number;
  /** Local clock (ms): the lease is held at least until then, counted from the request that renewed it. */
  expiresAt: number;
  /** When the next renewal is due (local clock, ms). */
  renewAt: number;
  /** Headers of a RenewLease for this lease: the task's W3C trace context (trace.ts traceHeaders). */
  headers?: Record<string, string> | undefined;
  /** Progress not yet sent. */
  progress?: { completedSteps: number; message: string } | undefined;
  /** Called once when the coordinator says the lease is gone, or it ran out unrenewed. */
  onEnd(end: LeaseEnd): void;
}

/** Renews a worker's leases over one StreamLeases stream, with RenewLease as the fallback. */
export interface LeaseKeeper {
  add(lease: HeldLease): void;
  remove(taskId: string): void;
  /** Ends the renewals and the stream. */
  stop(): Promise<void>;
}

const tickMs = 250;
const heartbeatMs = 5000;
const answerTimeoutMs = 10_000;

/**
 * Starts renewing. Every lease is renewed a third of its TTL after its last
 * renewal (the protocol asks for less than half); all leases due at once go
 * in one message, and a message goes at least every 5 s as the worker's
 * heartbeat. A broken stream is reopened after a backoff; while it is down,
 * or when the coordinator does not serve streams (`unimplemented`), each
 * lease is renewed with RenewLease. A lease that runs out on the local clock
 * without a renewal counts as lost.
 */
export function createLeaseKeeper(options: {
  client: Client<typeof LeaseService>;
  workerId: string;
  streams: boolean;
  log: (message: string) => void;
}): LeaseKeeper {
  const { client, workerId, log } = options;
  const leases = new Map<string, HeldLease>();
  const stopping = new AbortController();
  let streams = options.streams;
  let stream:
    | {
        outbox: Outbox<StreamLeasesRequest>;
        answers: AsyncIterator<StreamLeasesResponse>;
        abort: AbortController;
      }
    | undefined;
  let streamFailures = 0;
  let streamRetryAt = 0;
  let lastSent = Number.NEGATIVE_INFINITY;

  const end = (lease: HeldLease, outcome: LeaseEnd) => {
    if (leases.get(lease.taskId) !== lease) return;
    leases.delete(lease.taskId);
    lease.onEnd(outcome);
  };

  const apply = (lease: HeldLease, update: LeaseUpdate, sentAt: number) => {
    if (update.status === LeaseStatus.RENEWED) {
      lease.expiresAt = sentAt + lease.ttlSeconds * 1000;
      lease.renewAt = sentAt + (lease.ttlSeconds * 1000) / 3;
    } else if (update.status === LeaseStatus.CANCELED) {
      // TASK_CANCELED, or TIMEOUT: the attempt ran past the task's timeout_seconds.
      end(lease, { kind: "canceled", reason: update.reason || "TASK_CANCELED" });
    } else {
      end(lease, { kind: "lost", reason: update.reason || "LOST" });
    }
  };

  const closeStream = () => {
    if (!stream) return;
    stream.outbox.end();
    stream.abort.abort();
    stream = undefined;
  };

  const openStream = () => {
    const outbox = new Outbox<StreamLeasesRequest>();
    const abort = new AbortController();
    const answers = client.streamLeases(outbox, { signal: abort.signal })[Symbol.asyncIterator]();
    stream = { outbox, answers, abort };
    return stream;
  };

  /** One message over the stream; throws when the stream fails. */
  const viaStream = async (batch: HeldLease[]) => {
    const s = stream ?? openStream();
    const sentAt = performance.now();
    const sentProgress = batch.map((l) => l.progress);
    const request = create(StreamLeasesRequestSchema, {
      workerId,
      leases: batch.map((l) => ({
        taskId: l.taskId,
        attempt: l.attempt,
        leaseToken: l.leaseToken,
        progress: l.progress,
      })),
    });
    s.outbox.push(request);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new ConnectError("no answer on the lease stream", Code.DeadlineExceeded)),
        answerTimeoutMs,
      );
    });
    try {
      const next = await Promise.race([s.answers.next(), timeout]);
      if (next.done) throw new ConnectError("the lease stream ended", Code.Unavailable);
      batch.forEach((lease, i) => {
        if (lease.progress === sentProgress[i]) lease.progress = undefined;
        const update = next.value.leases[i];
        if (update) apply(lease, update, sentAt);
      });
      streamFailures = 0;
    } finally {
      clearTimeout(timer);
    }
  };

  /** One RenewLease per lease; a transient failure leaves the lease to the next round. */
  const viaUnary = async (batch: HeldLease[]) => {
    await Promise.all(
      batch.map(async (lease) => {
        const sentAt = performance.now();
        const progress = lease.progress;
        try {
          await client.renewLease(
            {
              taskId: lease.taskId,
              workerId,
              attempt: lease.attempt,
              leaseToken: lease.leaseToken,
              progress,
            },
            { timeoutMs: answerTimeoutMs, headers: lease.headers },
          );
          if (lease.progress === progress) lease.progress = undefined;
          lease.expiresAt = sentAt + lease.ttlSeconds * 1000;
          lease.renewAt = sentAt + (lease.ttlSeconds * 1000) / 3;
        } catch (error) {
          if (isLeaseRefusal(error)) {
            const reason = reasonOf(error);
            const stop = reason === "TASK_CANCELED" || reason === "TIMEOUT";
            end(lease, { kind: stop ? "canceled" : "lost", reason });
          } else if (!isTransient(error)) {
            end(lease, { kind: "lost", reason: String((error as Error).message) });
          } else {
            lease.renewAt = performance.now() + 1000;
          }
        }
      }),
    );
  };

  const round = async () => {
    const now = performance.now();
    for (const lease of [...leases.values()]) {
      if (now >= lease.expiresAt) end(lease, { kind: "lost", reason: "LEASE_EXPIRED" });
    }
    const all = [...leases.values()];
    const due = all.some((l) => now >= l.renewAt || (l.progress && now - lastSent >= 1000));
    if (!due && now - lastSent < heartbeatMs) return;
    lastSent = now;
    if (streams && now >= streamRetryAt) {
      try {
        await viaStream(all);
        return;
      } catch (error) {
        closeStream();
        if (stopping.signal.aborted) return;
        if (error instanceof ConnectError && error.code === Code.Unimplemented) {
          log("the coordinator does not serve StreamLeases; renewing with RenewLease");
          streams = false;
        } else {
          streamFailures++;
          streamRetryAt = performance.now() + backoffMs(streamFailures);
          log(`the lease stream failed (${(error as Error).message}); reopening it later`);
        }
      }
    }
    if (all.length > 0) await viaUnary(all.filter((l) => leases.get(l.taskId) === l));
  };

  const loop = (async () => {
    while (!stopping.signal.aborted) {
      await round();
      await sleep(tickMs, stopping.signal);
    }
    closeStream();
  })();

  return {
    add(lease) {
      leases.set(lease.taskId, lease);
    },
    remove(taskId) {
      leases.delete(taskId);
    },
    async stop() {
      stopping.abort();
      stream?.abort.abort();
      await loop;
    },
  };
}
