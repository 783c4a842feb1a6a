/**
 * The scheduling part of `npm run bench:compare` (BENCH_SCENARIOS=scheduling):
 *
 * - The cost of scheduling: the same 1b drain (BENCH_WORKERS workers, claims
 *   of BENCH_BATCH + CompleteTasks, BENCH_SCHED_TASKS tasks) on a fresh
 *   PostgreSQL coordinator twice: plain (no resources, shares or selectors),
 *   then with BENCH_SHARES (1,000) weighted shares, every task in one of them
 *   asking 10 resources, with two requirements and a preference, and every
 *   worker offering the 10 resources and matching labels. Reports tasks/s
 *   and each claim's time (p50/p99) of both, and their ratios.
 * - Fair share under a saturated mixed load: three shares weighted 1:2:1,
 *   tasks of 1 or 2 GPUs that run 20–80 ms (each worker holds what it
 *   claimed for that long, then completes it), BENCH_FAIR_SECONDS (20) of
 *   it; the GPU-seconds each share's leases held, from the tasks' own start
 *   and finish times, against its entitlement: the largest error, in
 *   percentage points.
 */
import { createClient } from "@connectrpc/connect";
import { ShareService } from "../gen/meshwork/v1/share_pb.js";
import { connectPostgres } from "../src/db/postgres-client.js";
import {
  type Coordinator,
  clients,
  drainWorkload,
  grpc,
  print,
  quantile,
  round2,
  startCoordinator,
} from "./lib.js";

const env = process.env;
const schedTasks = Number(env.BENCH_SCHED_TASKS ?? 20_000);
const shareCount = Number(env.BENCH_SHARES ?? 1000);
const fairSeconds = Number(env.BENCH_FAIR_SECONDS ?? 20);

/** The 10 resources a scheduled task asks and a worker offers (per task, per worker of `batch`). */
const asked = (i: number): Record<string, bigint> => ({
  cpu: 250n,
  memory: 256n,
  gpu: BigInt(i % 2),
  "license/a": 1n,
  "license/b": BigInt(i % 3 === 0 ? 1 : 0),
  "disk/scratch": 10n,
  "net/egress": 5n,
  fpga: 0n,
  "mem/huge": 2n,
  "tmp/io": 1n,
});
const offered = (batch: number): Record<string, bigint> => ({
  cpu: 250n * BigInt(batch),
  memory: 256n * BigInt(batch),
  gpu: BigInt(batch),
  "license/a": BigInt(batch),
  "license/b": BigInt(batch),
  "disk/scratch": 10n * BigInt(batch),
  "net/egress": 5n * BigInt(batch),
  fpga: 1n,
  "mem/huge": 2n * BigInt(batch),
  "tmp/io": BigInt(batch),
});

async function createAll(co: Coordinator, workload: string, n: number, scheduled: boolean) {
  const c = clients(grpc(co));
  for (let done = 0; done < n; done += 1000) {
    await c.tasks.createTasks({
      tasks: Array.from({ length: Math.min(1000, n - done) }, (_, k) => {
        const i = done + k;
        return scheduled
          ? {
              workload,
              share: `org/team-${i % shareCount}`,
              resources: asked(i),
              requirements: [
                { key: "zone", operator: 1, values: ["eu", "us"] },
                { key: "tier", operator: 5, values: ["1"] },
              ],
              preferences: [
                { weight: 10, requirement: { key: "disk", operator: 1, values: ["ssd"] } },
              ],
            }
          : { workload };
      }),
    });
  }
}

/** One drain, plain or scheduled, on a fresh coordinator: tasks/s and claim p50/p99. */
async function drainOnce(scheduled: boolean, o: { workers: number; batch: number }) {
  const co = await startCoordinator("postgres", { logsToStderr: true });
  try {
    const workload = `sched-${scheduled ? "on" : "off"}-${Date.now()}`;
    if (scheduled) {
      const shares = createClient(ShareService, grpc(co));
      for (let i = 0; i < shareCount; i++) {
        await shares.setShare({ path: `org/team-${i}`, weight: 1 + (i % 4) });
      }
    }
    await createAll(co, workload, schedTasks, scheduled);
    // The share book sees every share before the drain starts.
    await new Promise((r) => setTimeout(r, 1500));
    const claimMs: number[] = [];
    const d = await drainWorkload(co, workload, {
      ...o,
      tasks: schedTasks,
      claimMs,
      register: scheduled
        ? (i) => ({
            capacity: offered(o.batch),
            labels: { zone: i % 2 ? "eu" : "us", tier: "2", ...(i % 2 ? { disk: "ssd" } : {}) },
          })
        : undefined,
    });
    claimMs.sort((a, b) => a - b);
    return {
      tasksPerS: d.tasksPerS,
      p50: quantile(claimMs, 0.5),
      p99: quantile(claimMs, 0.99),
      cpu: d.cpuMsPerTask,
    };
  } finally {
    await co.stop();
  }
}

/** Three shares 1:2:1 under a saturated mixed load: each share's part of the GPU-seconds. */
async function fairShare(o: { workers: number }) {
  const co = await startCoordinator("postgres", { logsToStderr: true });
  const sql = connectPostgres(co.databaseUrl, { max: 1, onnotice: () => {} });
  try {
    const workload = `fair-${Date.now()}`;
    const shares = createClient(ShareService, grpc(co));
    await shares.setShare({ path: "fair/b", weight: 2 });
    const c = clients(grpc(co));
    const perShare = 4000;
    for (const share of ["fair/a", "fair/b", "fair/c"]) {
      for (let done = 0; done < perShare; done += 1000) {
        await c.tasks.createTasks({
          tasks: Array.from({ length: 1000 }, (_, k) => ({
            workload,
            share,
            resources: { gpu: BigInt(1 + ((done + k) % 2)) },
          })),
        });
      }
    }
    await new Promise((r) => setTimeout(r, 1500));
    const gpusEach = 4;
    const until = performance.now() + fairSeconds * 1000;
    const measuredFrom = new Date(Date.now() + 3000);
    await Promise.all(
      Array.from({ length: o.workers }, async () => {
        const w = clients(grpc(co));
        const { workerId } = await w.fleet.registerWorker({
          capabilities: [workload],
          maxConcurrency: 8,
          capacity: { gpu: BigInt(gpusEach) },
        });
        const running = new Set<Promise<void>>();
        while (performance.now() < until) {
          const { claims } = await w.leases.claimTasks({ workerId, maxTasks: 8, waitSeconds: 1 });
          for (const claim of claims) {
            const run = (async () => {
              await new Promise((r) => setTimeout(r, 20 + Math.random() * 60));
              await w.leases.completeTask({
                taskId: claim.taskId,
                workerId,
                attempt: claim.attempt,
              });
            })();
            running.add(run);
            void run.finally(() => running.delete(run));
          }
          if (claims.length === 0 || running.size >= 8)
            await Promise.race([...running, new Promise((r) => setTimeout(r, 50))]);
        }
        await Promise.all(running);
      }),
    );
    // GPU-seconds per share within the window, from the tasks' own times.
    const rows = await sql`select share,
        sum((resources->>'gpu')::int * extract(epoch from
          least(finished_at, now()) - greatest(started_at, ${measuredFrom}::timestamptz))) as gpu_seconds
      from tasks where workload = ${workload} and started_at is not null and finished_at > ${measuredFrom}::timestamptz
      group by share`;
    const total = rows.reduce((sum, r) => sum + Number(r.gpu_seconds), 0);
    const part = (s: string) =>
      (100 * Number(rows.find((r) => r.share === s)?.gpu_seconds ?? 0)) / total;
    const parts = { a: part("fair/a"), b: part("fair/b"), c: part("fair/c") };
    const error = Math.max(Math.abs(parts.a - 25), Math.abs(parts.b - 50), Math.abs(parts.c - 25));
    return { parts, error };
  } finally {
    await sql.end();
    await co.stop();
  }
}

/** Runs the part; the figures go into the run's table. */
export async function scheduling(
  figures: Record<string, number>,
  o: { workers: number; batch: number },
) {
  const plain = await drainOnce(false, o);
  const scheduled = await drainOnce(true, o);
  figures.sched1bRatio = scheduled.tasksPerS / plain.tasksPerS;
  figures.schedP50Ratio = scheduled.p50 / plain.p50;
  figures.schedP99Ratio = scheduled.p99 / plain.p99;
  print({
    scenario: "9-scheduling-cost",
    database: "postgres",
    tasks: schedTasks,
    workers: o.workers,
    batch: o.batch,
    shares: shareCount,
    resources: 10,
    plain: {
      tasks_per_s: Math.round(plain.tasksPerS),
      claim_p50_ms: plain.p50,
      claim_p99_ms: plain.p99,
      cpu_ms_per_task: plain.cpu,
    },
    scheduled: {
      tasks_per_s: Math.round(scheduled.tasksPerS),
      claim_p50_ms: scheduled.p50,
      claim_p99_ms: scheduled.p99,
      cpu_ms_per_task: scheduled.cpu,
    },
    ratio_1b: round2(figures.sched1bRatio),
    ratio_claim_p50: round2(figures.schedP50Ratio),
    ratio_claim_p99: round2(figures.schedP99Ratio),
  });
  const fair = await fairShare(o);
  figures.fairShareError = fair.error;
  print({
    scenario: "9-fair-share",
    database: "postgres",
    weights: "1:2:1",
    seconds: fairSeconds,
    workers: o.workers,
    parts_percent: { a: round2(fair.parts.a), b: round2(fair.parts.b), c: round2(fair.parts.c) },
    max_error_points: round2(fair.error),
  });
}
