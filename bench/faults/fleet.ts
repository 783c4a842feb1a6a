/**
 * The worker fleet of the fault suite's burst scenario (hostile.ts), as a
 * process of its own so that its thousands of calls do not slow the
 * suite's measurements:
 *
 *   tsx fleet.ts URL TOKEN WORKLOAD WORKERS STREAMS POLLS
 *
 * WORKERS workers, each on an HTTP/2 connection of its own (gRPC), each
 * holding STREAMS StreamLeases streams (a message every 5 s, as the SDK's
 * lease keeper sends its heartbeat; the first renews the leases it holds) and POLLS parked ClaimTasks long polls (one task,
 * 30 s). A claimed task is completed after 200 ms and the poll parked
 * again. It prints `{"ready":…}` once every stream and poll is open, a
 * `{"stats":…}` line whenever it reads a line on stdin, and a last one when
 * stdin ends, after closing everything.
 */
import { setMaxListeners } from "node:events";
import { createInterface } from "node:readline";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService, type StreamLeasesRequest } from "../../gen/meshwork/v1/lease_pb.js";

const [url = "", token = "", workload = "", w = "0", s = "0", p = "0"] = process.argv.slice(2);
const workers = Number(w);
const streamsPer = Number(s);
const pollsPer = Number(p);
const stop = new AbortController();
// Every stream and poll of this process listens on it: thousands, on purpose.
setMaxListeners(0, stop.signal);
const stats = {
  streamsOpen: 0,
  /** Streams the coordinator ended (an error before we closed them), by code. */
  streamsLost: {} as Record<string, number>,
  pollCycles: 0,
  claimed: 0,
  completed: 0,
  pollErrors: {} as Record<string, number>,
  completeErrors: 0,
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const codeOf = (e: unknown) => Code[ConnectError.from(e).code] ?? "unknown";

type Held = { taskId: string; attempt: number; leaseToken: string };

async function worker(i: number) {
  const transport = createGrpcTransport({
    baseUrl: url,
    interceptors: [
      (next) => (req) => {
        req.header.set("authorization", `Bearer ${token}`);
        return next(req);
      },
    ],
  });
  const fleet = createClient(FleetService, transport);
  const leases = createClient(LeaseService, transport);
  const { workerId } = await fleet.registerWorker({
    name: `burst-${i}`,
    capabilities: [workload],
    maxConcurrency: 1000,
  });
  const held = new Map<string, Held>();

  // The first stream renews the worker's leases, as the SDK's one lease
  // keeper does; the others only beat.
  const stream = async (_: unknown, n: number) => {
    async function* messages(): AsyncGenerator<StreamLeasesRequest> {
      while (!stop.signal.aborted) {
        const leases = n === 0 ? [...held.values()] : [];
        yield { workerId, leases } as unknown as StreamLeasesRequest;
        await sleep(5000);
      }
    }
    stats.streamsOpen++;
    try {
      for await (const _ of leases.streamLeases(messages(), { signal: stop.signal }));
    } catch (error) {
      if (!stop.signal.aborted) {
        const code = codeOf(error);
        stats.streamsLost[code] = (stats.streamsLost[code] ?? 0) + 1;
      }
    } finally {
      stats.streamsOpen--;
    }
  };

  const poll = async () => {
    while (!stop.signal.aborted) {
      try {
        const { claims } = await leases.claimTasks(
          { workerId, maxTasks: 1, waitSeconds: 30 },
          { signal: stop.signal },
        );
        stats.pollCycles++;
        for (const c of claims) {
          stats.claimed++;
          const lease = { taskId: c.taskId, attempt: c.attempt, leaseToken: c.leaseToken };
          held.set(c.taskId, lease);
          await sleep(200);
          await leases.completeTask({ ...lease, workerId, resultSummary: "done" }).then(
            () => stats.completed++,
            () => stats.completeErrors++,
          );
          held.delete(c.taskId);
        }
      } catch (error) {
        if (stop.signal.aborted) return;
        const code = codeOf(error);
        stats.pollErrors[code] = (stats.pollErrors[code] ?? 0) + 1;
        await sleep(500);
      }
    }
  };

  return [...Array.from({ length: streamsPer }, stream), ...Array.from({ length: pollsPer }, poll)];
}

const running: Promise<void>[] = [];
for (let i = 0; i < workers; i += 20) {
  const batch = await Promise.all(
    Array.from({ length: Math.min(20, workers - i) }, (_, j) => worker(i + j)),
  );
  for (const b of batch) running.push(...b);
}
while (stats.streamsOpen < workers * streamsPer) await sleep(50);
console.log(JSON.stringify({ ready: stats }));
const lines = createInterface({ input: process.stdin });
for await (const _ of lines) console.log(JSON.stringify({ stats }));
stop.abort();
await Promise.all(running);
console.log(JSON.stringify({ stats, closed: true }));
process.exit(0);
