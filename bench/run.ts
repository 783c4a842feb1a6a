/**
 * `npm run bench`: BENCHMARKS.md scenarios 1 (drain) and 3 (create→claim
 * latency), against PostgreSQL and embedded PGlite. The coordinator runs as
 * its own process (`meshwork serve`), the workers in this one, over gRPC on
 * h2c. Prints one JSON line per scenario and database.
 *
 * Environment: BENCH_DB=both|postgres|pglite, BENCH_TASKS (20000),
 * BENCH_WORKERS (16), BENCH_LATENCY_SAMPLES (1000), BENCH_PG_URL
 * (postgres://postgres@127.0.0.1:5432/postgres; a fresh database is created
 * and dropped inside it).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Client, createClient, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import postgres from "postgres";
import { FleetService } from "../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../gen/meshwork/v1/task_pb.js";

const env = process.env;
const totalTasks = Number(env.BENCH_TASKS ?? 20_000);
const workerCount = Number(env.BENCH_WORKERS ?? 16);
const latencySamples = Number(env.BENCH_LATENCY_SAMPLES ?? 1000);
const pgUrl = env.BENCH_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const which = env.BENCH_DB ?? "both";

interface Coordinator {
  url: string;
  database: string;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

async function startCoordinator(database: "postgres" | "pglite"): Promise<Coordinator> {
  const port = await freePort();
  const dataDir = mkdtempSync(join(tmpdir(), "meshwork-bench-"));
  let dbName = "";
  let admin: postgres.Sql | undefined;
  const childEnv: NodeJS.ProcessEnv = { ...env, MESHWORK_LOG_LEVEL: "warn" };
  delete childEnv.DATABASE_URL;
  if (database === "postgres") {
    dbName = `meshwork_bench_${process.pid}_${Date.now()}`;
    admin = postgres(pgUrl, { max: 1, onnotice: () => {} });
    await admin.unsafe(`create database ${dbName}`);
    const url = new URL(pgUrl);
    url.pathname = `/${dbName}`;
    childEnv.DATABASE_URL = url.toString();
  }
  const child: ChildProcess = spawn(
    process.execPath,
    ["bin/meshwork.js", "serve", "--listen", `127.0.0.1:${port}`, "--data-dir", dataDir],
    { env: childEnv, stdio: ["ignore", "inherit", "inherit"] },
  );
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${url}/readyz`)).ok) break;
    } catch {
      // not listening yet
    }
    if (i > 200) throw new Error("coordinator did not start");
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    database,
    async stop() {
      child.kill("SIGTERM");
      await new Promise((r) => child.once("exit", r));
      if (admin) {
        await admin.unsafe(`drop database if exists ${dbName} with (force)`);
        await admin.end();
      }
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

interface Clients {
  fleet: Client<typeof FleetService>;
  tasks: Client<typeof TaskService>;
  leases: Client<typeof LeaseService>;
}

function clients(transport: Transport): Clients {
  return {
    fleet: createClient(FleetService, transport),
    tasks: createClient(TaskService, transport),
    leases: createClient(LeaseService, transport),
  };
}

function print(line: Record<string, unknown>) {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

/** Creates `n` tasks of `workload`, 1,000 per CreateTasks call; returns tasks/s. */
async function enqueue(c: Clients, workload: string, n: number): Promise<number> {
  const started = performance.now();
  for (let done = 0; done < n; done += 1000) {
    const count = Math.min(1000, n - done);
    await c.tasks.createTasks({ tasks: Array.from({ length: count }, () => ({ workload })) });
  }
  return n / ((performance.now() - started) / 1000);
}

/** Scenario 1: W workers claim and complete every task; batch = max_tasks. */
async function drain(co: Coordinator, batch: number) {
  const setup = clients(createGrpcTransport({ baseUrl: co.url }));
  const workload = `drain-${batch}-${Date.now()}`;
  const enqueueRate = await enqueue(setup, workload, totalTasks);
  let completed = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: workerCount }, async () => {
      const c = clients(createGrpcTransport({ baseUrl: co.url }));
      const { workerId } = await c.fleet.registerWorker({
        capabilities: [workload],
        maxConcurrency: batch,
      });
      while (completed < totalTasks) {
        const { claims } = await c.leases.claimTasks({ workerId, maxTasks: batch });
        if (claims.length === 0) {
          await new Promise((r) => setTimeout(r, 5));
          continue;
        }
        if (batch === 1) {
          for (const claim of claims) {
            await c.leases.completeTask({
              taskId: claim.taskId,
              workerId,
              attempt: claim.attempt,
              leaseToken: claim.leaseToken,
            });
          }
        } else {
          const { results } = await c.leases.completeTasks({
            completions: claims.map((claim) => ({
              taskId: claim.taskId,
              workerId,
              attempt: claim.attempt,
              leaseToken: claim.leaseToken,
            })),
          });
          if (results.some((r) => r.outcome.case !== "task"))
            throw new Error("a completion was refused");
        }
        completed += claims.length;
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  print({
    scenario: batch === 1 ? "1a-drain-claim1-complete1" : `1b-drain-claim${batch}-completeTasks`,
    database: co.database,
    transport: "grpc-h2c",
    tasks: totalTasks,
    workers: workerCount,
    tasks_per_s: Math.round(totalTasks / seconds),
    seconds: Math.round(seconds * 100) / 100,
  });
  if (batch !== 1) {
    print({
      scenario: "2b-enqueue-createTasks-1000",
      database: co.database,
      tasks_per_s: Math.round(enqueueRate),
    });
  }
}

/** Scenario 3: one idle worker long-polls; serial CreateTask; create→claim latency. */
async function latency(co: Coordinator) {
  const creator = clients(createGrpcTransport({ baseUrl: co.url }));
  const worker = clients(createGrpcTransport({ baseUrl: co.url }));
  const workload = `latency-${Date.now()}`;
  const { workerId } = await worker.fleet.registerWorker({ capabilities: [workload] });
  const samples: number[] = [];
  for (let i = 0; i < latencySamples; i++) {
    const polling = worker.leases.claimTasks({ workerId, maxTasks: 1, waitSeconds: 30 });
    // Let the long poll reach the server and start waiting.
    await new Promise((r) => setTimeout(r, 2));
    const sent = performance.now();
    await creator.tasks.createTask({ workload });
    const { claims } = await polling;
    if (claims.length !== 1) throw new Error("the long poll returned no task");
    samples.push(performance.now() - sent);
  }
  samples.sort((a, b) => a - b);
  const pct = (p: number) =>
    Math.round((samples[Math.min(samples.length - 1, Math.floor(p * samples.length))] ?? 0) * 100) /
    100;
  print({
    scenario: "3-create-to-claim-latency",
    database: co.database,
    transport: "grpc-h2c",
    samples: samples.length,
    p50_ms: pct(0.5),
    p99_ms: pct(0.99),
    max_ms: pct(1),
  });
}

const databases =
  which === "both" ? (["postgres", "pglite"] as const) : ([which] as ["postgres" | "pglite"]);
for (const database of databases) {
  const co = await startCoordinator(database);
  try {
    await drain(co, 1);
    await drain(co, 32);
    await latency(co);
  } finally {
    await co.stop();
  }
}
