/**
 * `npm run bench:compare`: Meshwork against its reference points of
 * docs/benchmarks.md, measured in ONE run on the same PostgreSQL, so that
 * the ratios mean something on a noisy machine. Prints one JSON line per
 * measurement, then a table of each ratio beside its target and whether it
 * is met. Meshwork runs as its own process (`meshwork serve`, auth on, as in
 * bench/run.ts, whose code it shares through bench/lib.ts); its workers run
 * in this process over gRPC on h2c, one HTTP/2 connection per worker.
 *
 * Parts (BENCH_SCENARIOS, a comma list; default every part but sweep):
 *
 * - graphile: graphile-worker 0.16.6 in this process (concurrency 16 =
 *   BENCH_WORKERS, a task that does nothing, default pollInterval), in its
 *   own database bench_graphile_<pid> (created, dropped). BENCH_TASKS jobs
 *   added by graphile_worker.add_jobs, 1,000 per call, their specs sent as
 *   one JSON parameter (the add rate, beside 2b), then drained: jobs/s from
 *   run() until no job is left; then scenario 3's peer: BENCH_LATENCY_SAMPLES
 *   jobs added one at a time by add_job while the worker waits, the time
 *   from the call to the start of its task (p50/p99).
 * - peers (bench/peers.ts): pg-boss 10.4.2, BullMQ 6.7.0 on Redis
 *   (BENCH_REDIS_URL, default redis://127.0.0.1:6379) and BullMQ 6.7.0 on
 *   its PostgreSQL backend, each adding BENCH_TASKS no-op jobs 1,000 per
 *   call and draining them with concurrency BENCH_WORKERS in this process.
 * - ceiling: the transport ceiling (bench/ceiling-server.ts, its own
 *   process: connectNodeAdapter on http2.createServer, TCP_NODELAY, a no-op
 *   grpc.health.v1.Health/Check, no interceptors, no database), and
 *   Meshwork's own Health/Check through its whole stack, both called with
 *   the drain's client code: BENCH_WORKERS callers, one HTTP/2 connection
 *   each, BENCH_CALLS calls to each (after 20 per caller to warm up), in
 *   BENCH_CEILING_ROUNDS (5) rounds taken in turn, bare then Meshwork:
 *   calls/s and CPU per call (server, callers), and the median of the
 *   rounds' ratios of server CPU per call; then one caller's serial calls:
 *   latency p50/p99, the floor under scenario 3.
 * - postgres: scenarios 1a (claim 1 + CompleteTask), 1b (claim
 *   BENCH_BATCH + CompleteTasks), 2b (CreateTasks of 1,000) and 3
 *   (create→claim latency) on PostgreSQL, each drain with its CPU per task
 *   (workers, coordinator, every postgres process); then the floor under
 *   2b and 3: the same rows inserted by one SQL statement in process (1,000
 *   per statement: rows/s; one, serially: latency); and the floor under
 *   1b: the same drain made by the coordinator's own lease store in this
 *   process (its statements, no RPC).
 * - leases (scenario 4): 1b drains of BENCH_LEASE_TASKS (60,000: longer
 *   than a renewal period here) on one coordinator, without, with, and
 *   again without BENCH_HELD_LEASES held leases (another workload, claimed
 *   by BENCH_LEASE_STREAMS other workers with lease_seconds 3600) renewed
 *   over StreamLeases, one stream per holder, each message renewing all of
 *   its holder's leases every BENCH_RENEW_SECONDS (the streams staggered
 *   over the period, the first message at the drain's start). Ratio: with ÷
 *   the mean of the two without. `VACUUM tasks` (no ANALYZE) before each
 *   drain, so that one drain's dead rows (autovacuum off) do not slow the
 *   next.
 * - history (retention's target): 1b on a fresh database and on one that
 *   BENCH_HISTORY (1,000,000) finished tasks went through (inserted with SQL,
 *   finished within the retention window, so kept), both coordinators up,
 *   their drains of BENCH_BACKLOG_DRAIN (10,000) tasks taken in turn
 *   BENCH_HISTORY_ROUNDS (3) times; ratio of the medians, fresh ÷ after.
 * - pglite (scenario 5): 1a, 1b and 3 on a coordinator without
 *   DATABASE_URL (embedded PGlite, fresh --data-dir). Ratios to the
 *   postgres part.
 * - memory (scenario 6): coordinator RSS 2 s after /readyz answers 200, on
 *   PostgreSQL and on PGlite; then on PostgreSQL with BENCH_MEMORY_WORKERS
 *   registered workers, each with an open StreamLeases stream and a parked
 *   long-poll ClaimTasks (wait 30 s), over 8 HTTP/2 connections, 2 s after
 *   all streams answered.
 * - backlog (scenario 7): for BENCH_BACKLOG_SMALL (10,000) and
 *   BENCH_BACKLOG (1,000,000) PENDING tasks, each on a fresh coordinator:
 *   the backlog inserted straight into its tasks table (one
 *   `insert … select … from generate_series`, the columns the coordinator
 *   sets, its defaults otherwise, created_at 1 ms apart; no ANALYZE), plus
 *   the tasks the measurement takes, so at least that many stay PENDING
 *   throughout; then one worker's serial claims of 32 + CompleteTasks
 *   (BENCH_BACKLOG_CLAIMS, 600: claim p50/p99), and a 1b drain of
 *   BENCH_BACKLOG_DRAIN (10,000) tasks. Prints `show autovacuum`.
 * - bloat (bench/bloat.ts, whose header says what it does): the claim
 *   and 1b after BENCH_BLOAT (1,000,000) tasks went through, with the
 *   coordinator's own vacuum and without.
 * - pinned (bench/bloat.ts): the claim and 1b while a transaction pins the
 *   xmin horizon for BENCH_PIN_SECONDS (600) of a 1b drain.
 * - sweep (scenario 8, only when named): 1b drains (claim N +
 *   CompleteTasks) for workers 1, 4, 16, 64 × batch 1, 8, 32, 100, each on a
 *   fresh PostgreSQL coordinator, workers × batch × 10 tasks each (about 10
 *   claims per worker) but at least BENCH_SWEEP_TASKS (2,000) and at most
 *   BENCH_SWEEP_MAX (20,000); written to bench/results/sweep-<date>.json and
 *   drawn as bench/sweep.svg (bench/sweep-svg.ts redraws it from the JSON).
 * - scheduling (scenario 9, bench/scheduling.ts, whose header says what it
 *   does): the cost of resources, shares and selectors (1b plain ÷ 1b with
 *   BENCH_SHARES shares and 10 resources, and the claims' p50/p99), and the
 *   fair-share error of three weighted shares under a saturated mixed load.
 *
 * Every coordinator a drain or claim is measured on is warmed up first:
 * BENCH_WARMUP (1,000) tasks of another workload drained with claims of 32,
 * and a fifth as many with claims of 1, not measured.
 *
 * Coordinators log on stderr, where each part also says how long it took;
 * stdout carries only the JSON lines and the table.
 *
 * Other environment: BENCH_TASKS (20000), BENCH_WORKERS (16), BENCH_BATCH
 * (32), BENCH_LATENCY_SAMPLES (1000), BENCH_CALLS (20000), BENCH_PG_URL
 * (postgres://postgres@127.0.0.1:5432/postgres; every database is created
 * and dropped inside that server).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { setMaxListeners } from "node:events";
import { mkdirSync, writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { createInterface } from "node:readline";
import { type Client, createClient } from "@connectrpc/connect";
import { sql as statement } from "drizzle-orm";
import { Logger, run, runMigrations } from "graphile-worker";
import { Health } from "../gen/grpc/health/v1/health_pb.js";
import {
  type Claim,
  LeaseStatus,
  type StreamLeasesRequest,
  type StreamLeasesResponse,
} from "../gen/meshwork/v1/lease_pb.js";
import { openDatabase } from "../src/db/database.js";
import { connectPostgres } from "../src/db/postgres-client.js";
import { createLeaseStore } from "../src/leases/store.js";
import { bloatPinned, bloatThrough } from "./bloat.js";
import {
  type Coordinator,
  clients,
  completionsOf,
  cpuMeter,
  drain,
  drainScenario,
  drainWorkload,
  enqueue,
  grpc,
  grpcTo,
  latency,
  print,
  quantile,
  round2,
  rssOf,
  startCoordinator,
  taskIdAt,
  withDatabase,
} from "./lib.js";
import { bullmq, pgBoss } from "./peers.js";
import { scheduling } from "./scheduling.js";
import { drawSweep, type SweepPoint, type SweepResults } from "./sweep-svg.js";

const env = process.env;
const tasks = Number(env.BENCH_TASKS ?? 20_000);
const workers = Number(env.BENCH_WORKERS ?? 16);
const batch = Number(env.BENCH_BATCH ?? 32);
const latencySamples = Number(env.BENCH_LATENCY_SAMPLES ?? 1000);
const calls = Number(env.BENCH_CALLS ?? 20_000);
const ceilingRounds = Number(env.BENCH_CEILING_ROUNDS ?? 5);
const heldLeases = Number(env.BENCH_HELD_LEASES ?? 1000);
const leaseStreams = Number(env.BENCH_LEASE_STREAMS ?? 4);
const leaseTasks = Number(env.BENCH_LEASE_TASKS ?? 60_000);
const renewSeconds = Number(env.BENCH_RENEW_SECONDS ?? 10);
const memoryWorkers = Number(env.BENCH_MEMORY_WORKERS ?? 1000);
const backlogSmall = Number(env.BENCH_BACKLOG_SMALL ?? 10_000);
const backlogBig = Number(env.BENCH_BACKLOG ?? 1_000_000);
const backlogClaims = Number(env.BENCH_BACKLOG_CLAIMS ?? 600);
const backlogDrain = Number(env.BENCH_BACKLOG_DRAIN ?? 10_000);
const sweepTasks = Number(env.BENCH_SWEEP_TASKS ?? 2000);
const sweepMax = Number(env.BENCH_SWEEP_MAX ?? 20_000);
const warmupTasks = Number(env.BENCH_WARMUP ?? 1000);
const historyDone = Number(env.BENCH_HISTORY ?? 1_000_000);
const historyRounds = Number(env.BENCH_HISTORY_ROUNDS ?? 3);
const parts = (
  env.BENCH_SCENARIOS ??
  "graphile,peers,ceiling,postgres,leases,pglite,memory,backlog,history,bloat,pinned,scheduling"
)
  .split(",")
  .map((s) => s.trim());
const known = [
  "graphile",
  "peers",
  "ceiling",
  "postgres",
  "leases",
  "pglite",
  "memory",
  "backlog",
  "history",
  "bloat",
  "pinned",
  "scheduling",
  "sweep",
];
for (const p of parts) {
  if (!known.includes(p))
    throw new Error(`BENCH_SCENARIOS: unknown part ${p} (${known.join(",")})`);
}

/** The figures the ratio table is computed from, by name. */
const figures: Record<string, number> = {};
/** Coordinators log on our stderr: stdout carries the JSON lines and the table only. */
const quiet = { logsToStderr: true };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const round3 = (x: number) => Math.round(x * 1000) / 1000;
const mib = (bytes: number) => Math.round((bytes / 1048576) * 10) / 10;

// ---------------------------------------------------------------- graphile

async function graphile() {
  await withDatabase("bench_graphile", graphileOn);
}

async function graphileOn(connectionString: string) {
  const sql = connectPostgres(connectionString, { max: 1, onnotice: () => {} });
  try {
    // Errors only: graphile-worker logs every job otherwise.
    const logger = new Logger(() => (level, message) => {
      if (level === "error") process.stderr.write(`graphile-worker: ${message}\n`);
    });
    await runMigrations({ connectionString, logger });
    const addStarted = performance.now();
    for (let done = 0; done < tasks; done += 1000) {
      const count = Math.min(1000, tasks - done);
      // The job specs built here and sent as one JSON parameter, as a client
      // adding jobs does (graphile's own addJobs sends JSON the same way).
      const specs = JSON.stringify(
        Array.from({ length: count }, () => ({ identifier: "noop", payload: {} })),
      );
      await sql`select graphile_worker.add_jobs(array(
        select json_populate_record(null::graphile_worker.job_spec, j)
        from json_array_elements(${specs}::text::json) j))`;
    }
    const addRate = tasks / ((performance.now() - addStarted) / 1000);
    let ran = 0;
    // Scenario 3's peer: a job added while the worker waits, until its task starts.
    let onStart: () => void = () => {};
    const started = performance.now();
    const cpu = cpuMeter();
    const runner = await run({
      connectionString,
      concurrency: workers,
      noHandleSignals: true,
      logger,
      taskList: {
        noop: async () => {
          ran++;
        },
        started: async () => {
          onStart();
        },
      },
    });
    // Done when every job ran and its completion committed (the job row is gone).
    for (;;) {
      if (ran >= tasks) {
        const [row] = await sql`select count(*)::int as n from graphile_worker._private_jobs`;
        if (row?.n === 0) break;
      }
      await sleep(5);
    }
    const seconds = (performance.now() - started) / 1000;
    const cpuMs = cpu(tasks);
    const addToStart: number[] = [];
    for (let i = 0; i < latencySamples; i++) {
      await sleep(2);
      const begun = new Promise<void>((r) => {
        onStart = r;
      });
      const sent = performance.now();
      await sql`select graphile_worker.add_job('started')`;
      await begun;
      addToStart.push(performance.now() - sent);
    }
    addToStart.sort((a, b) => a - b);
    figures.graphileStartP50 = quantile(addToStart, 0.5);
    await runner.stop();
    await runner.promise.catch(() => {});
    figures.graphile = tasks / seconds;
    figures.graphileAdd = addRate;
    figures.graphileCpu = cpuMs.client + (cpuMs.postgres ?? 0);
    print({
      scenario: "graphile-worker-drain",
      version: "0.16.6",
      database: "postgres",
      jobs: tasks,
      concurrency: workers,
      jobs_per_s: Math.round(figures.graphile),
      seconds: round2(seconds),
      // graphile-worker runs in this process: "client" is graphile-worker itself.
      cpu_ms_per_job: { graphile_worker: cpuMs.client, postgres: cpuMs.postgres },
    });
    print({
      scenario: "graphile-worker-add-to-start-latency",
      database: "postgres",
      samples: addToStart.length,
      p50_ms: figures.graphileStartP50,
      p99_ms: quantile(addToStart, 0.99),
    });
    print({
      scenario: "graphile-worker-add_jobs-1000",
      database: "postgres",
      jobs_per_s: Math.round(addRate),
    });
  } finally {
    await sql.end();
  }
}

// ---------------------------------------------------------------- ceiling

/** `workers` Health/Check callers of `baseUrl`, one HTTP/2 connection each, warmed up (20 calls each). */
async function healthCallers(baseUrl: string, token: string) {
  const callers = Array.from({ length: workers }, () =>
    createClient(Health, grpcTo(baseUrl, token)),
  );
  await Promise.all(
    callers.map(async (c) => {
      for (let i = 0; i < 20; i++) await c.check({});
    }),
  );
  return callers;
}

/** `n` calls from all the callers at once: seconds taken and CPU per call (server `pid`, callers). */
async function healthRound(callers: Client<typeof Health>[], pid: number, n: number) {
  let issued = 0;
  const started = performance.now();
  const cpu = cpuMeter(pid, false);
  await Promise.all(
    callers.map(async (c) => {
      while (issued < n) {
        issued++;
        await c.check({});
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const cpuMs = cpu(n);
  return { seconds, server: cpuMs.coordinator ?? 0, client: cpuMs.client };
}

/** One caller's serial calls (BENCH_LATENCY_SAMPLES): the latency of a call when nothing else runs. */
async function healthSerial(callers: Client<typeof Health>[]) {
  const serial: number[] = [];
  const [one] = callers;
  for (let i = 0; one && i < latencySamples; i++) {
    const sent = performance.now();
    await one.check({});
    serial.push(performance.now() - sent);
  }
  serial.sort((a, b) => a - b);
  return { p50: quantile(serial, 0.5), p99: quantile(serial, 0.99) };
}

/**
 * `calls` Health/Check calls to each of the bare server and Meshwork, in
 * `ceilingRounds` rounds taken in turn (bare, Meshwork, bare, …), so that
 * each pair sees the machine within seconds of each other (the order is
 * always bare first, so an effect of order is not cancelled): calls/s and CPU per call of
 * each over all its rounds, and the median of the rounds' ratios of server
 * CPU per call (Meshwork's round ÷ the bare round just before it). One
 * measurement of each after the other moved the ratio between 0.98 and
 * 1.36 in three runs of the same code here. Then each one's serial calls.
 */
async function healthPaired(
  bare: { url: string; pid: number },
  meshwork: { url: string; pid: number },
  token: string,
) {
  const b = await healthCallers(bare.url, token);
  const m = await healthCallers(meshwork.url, token);
  const roundsRun = Math.max(1, Math.round(ceilingRounds));
  const each = Math.ceil(calls / roundsRun);
  const rounds: {
    bare: Awaited<ReturnType<typeof healthRound>>;
    meshwork: (typeof rounds)[0]["bare"];
  }[] = [];
  for (let r = 0; r < roundsRun; r++) {
    rounds.push({
      bare: await healthRound(b, bare.pid, each),
      meshwork: await healthRound(m, meshwork.pid, each),
    });
  }
  const sum = (xs: number[]) => xs.reduce((a, x) => a + x, 0);
  const overall = (side: "bare" | "meshwork") => {
    const of = rounds.map((r) => r[side]);
    return {
      rate: (each * of.length) / sum(of.map((x) => x.seconds)),
      serverCpuMsPerCall: sum(of.map((x) => x.server)) / of.length,
      cpuMsPerCall: sum(of.map((x) => x.server + x.client)) / of.length,
    };
  };
  const ratios = rounds.map((r) => r.meshwork.server / r.bare.server).sort((x, y) => x - y);
  // The median, unrounded (quantile rounds to two places).
  const mid = Math.floor(ratios.length / 2);
  const median =
    ratios.length % 2 === 1
      ? (ratios[mid] as number)
      : ((ratios[mid - 1] as number) + (ratios[mid] as number)) / 2;
  return {
    bare: { ...overall("bare"), serial: await healthSerial(b) },
    meshwork: { ...overall("meshwork"), serial: await healthSerial(m) },
    serverCpuRatio: median,
    calls: each * roundsRun,
    serverCpuRatios: ratios.map((x) => Math.round(x * 100) / 100),
  };
}

async function startCeilingServer(): Promise<{ url: string; child: ChildProcess; pid: number }> {
  const child = spawn(process.execPath, ["--import", "tsx", "bench/ceiling-server.ts"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  for await (const line of lines) {
    const { port } = JSON.parse(line) as { port: number };
    lines.close();
    return { url: `http://127.0.0.1:${port}`, child, pid: child.pid ?? 0 };
  }
  throw new Error("the ceiling server did not start");
}

async function ceiling(co: Coordinator) {
  const bareServer = await startCeilingServer();
  let paired: Awaited<ReturnType<typeof healthPaired>>;
  try {
    paired = await healthPaired(bareServer, { url: co.url, pid: co.pid }, co.token);
  } finally {
    bareServer.child.kill("SIGTERM");
  }
  const { bare: b, meshwork: m } = paired;
  figures.ceiling = b.rate;
  figures.ceilingCpu = b.cpuMsPerCall;
  figures.ceilingServerCpu = b.serverCpuMsPerCall;
  figures.ceilingSerialP50 = b.serial.p50;
  figures.health = m.rate;
  figures.healthSerialP50 = m.serial.p50;
  figures.healthServerCpu = m.serverCpuMsPerCall;
  figures.serverCpuRatio = paired.serverCpuRatio;
  print({
    scenario: "transport-ceiling-bare-connect-node",
    transport: "grpc-h2c",
    method: "grpc.health.v1.Health/Check (no-op)",
    calls: paired.calls,
    callers: workers,
    rounds: Math.max(1, Math.round(ceilingRounds)),
    calls_per_s: Math.round(b.rate),
    cpu_ms_per_call: round3(b.cpuMsPerCall),
    server_cpu_ms_per_call: round3(b.serverCpuMsPerCall),
    serial_p50_ms: b.serial.p50,
    serial_p99_ms: b.serial.p99,
  });
  print({
    scenario: "meshwork-health-check",
    database: co.database,
    transport: "grpc-h2c",
    calls: paired.calls,
    callers: workers,
    rounds: Math.max(1, Math.round(ceilingRounds)),
    calls_per_s: Math.round(m.rate),
    cpu_ms_per_call: round3(m.cpuMsPerCall),
    server_cpu_ms_per_call: round3(m.serverCpuMsPerCall),
    server_cpu_ratio_median: round3(paired.serverCpuRatio),
    server_cpu_ratio_rounds: paired.serverCpuRatios,
    serial_p50_ms: m.serial.p50,
    serial_p99_ms: m.serial.p99,
  });
}

// ---------------------------------------------------------------- 1a, 1b, 2b, 3

/**
 * Runs a fresh coordinator's paths once before anything is measured on it
 * (a first drain ran at a third of the second's rate here): BENCH_WARMUP
 * tasks drained with claims of 32 and a fifth as many with claims of 1.
 */
async function warmUp(co: Coordinator) {
  if (warmupTasks <= 0) return;
  await drain(co, { batch: 32, tasks: warmupTasks, workers });
  await drain(co, { batch: 1, tasks: Math.ceil(warmupTasks / 5), workers });
}

async function drains(co: Coordinator, prefix: string) {
  await warmUp(co);
  for (const b of [1, batch]) {
    const r = await drain(co, { batch: b, tasks, workers });
    const name = `${prefix}${b === 1 ? "1a" : "1b"}`;
    figures[name] = r.tasksPerS;
    figures[`${name}CoordinatorCpu`] = r.cpuMsPerTask.coordinator ?? 0;
    figures[`${name}OthersCpu`] = r.cpuMsPerTask.client + (r.cpuMsPerTask.postgres ?? 0);
    figures[`${name}PostgresCpu`] = r.cpuMsPerTask.postgres ?? 0;
    print({
      scenario: drainScenario(b),
      database: co.database,
      transport: "grpc-h2c",
      tasks: r.completed,
      workers,
      tasks_per_s: Math.round(r.tasksPerS),
      seconds: round2(r.seconds),
      cpu_ms_per_task: r.cpuMsPerTask,
    });
    if (b !== 1) {
      figures[`${prefix}2b`] = r.enqueueRate;
      print({
        scenario: "2b-enqueue-createTasks-1000",
        database: co.database,
        tasks_per_s: Math.round(r.enqueueRate),
      });
    }
  }
  const l = await latency(co, latencySamples);
  figures[`${prefix}p50`] = l.p50_ms;
  figures[`${prefix}p99`] = l.p99_ms;
  print({
    scenario: "3-create-to-claim-latency",
    database: co.database,
    transport: "grpc-h2c",
    ...l,
  });
  if (co.database === "postgres") {
    await insertFloor(co);
    await drainFloor(co);
  }
}

/**
 * The floor under 1b: the same drain (BENCH_WORKERS workers, claims of
 * BENCH_BATCH, each claim's tasks completed in one batch) made by the
 * coordinator's own lease store (src/leases/store.ts) in this process, on
 * the coordinator's database: its prepared claim and completion
 * statements, the same group commit of concurrent claims, no RPC, no
 * service layer (no share plan, heartbeats or dependency outputs: one
 * share, no dependencies). Measured as the drains are: after `VACUUM tasks`
 * (the runs before it left their dead rows, autovacuum off) and a warm-up
 * of the store's connections (BENCH_WARMUP tasks). CPU per task: this
 * process and PostgreSQL.
 */
async function drainFloor(co: Coordinator) {
  const setup = clients(grpc(co));
  const stamp = Date.now();
  const database = await openDatabase({ url: co.databaseUrl, dataDir: "unused" });
  try {
    const store = createLeaseStore(database.db);
    const drainIn = async (workload: string, count: number) => {
      await enqueue(setup, workload, count);
      const ids = await Promise.all(
        Array.from({ length: workers }, async () => {
          const r = await setup.fleet.registerWorker({
            capabilities: [workload],
            maxConcurrency: batch,
          });
          return r.workerId;
        }),
      );
      let completed = 0;
      const cpu = cpuMeter(undefined, true);
      const started = performance.now();
      await Promise.all(
        ids.map(async (id) => {
          const worker = { id, capabilities: [workload], labels: {} };
          while (completed < count) {
            const { rows } = await store.claimCounted(worker, batch);
            if (rows.length === 0) break;
            const outcomes = await store.complete(
              rows.map((r) => ({
                taskId: r.id,
                workerId: id,
                attempt: r.attempt,
                token: r.leaseToken ?? "",
                result: null,
                summary: "",
                metrics: {},
              })),
            );
            if (outcomes.some((o) => "error" in o)) throw new Error("a completion was refused");
            completed += rows.length;
          }
        }),
      );
      const seconds = (performance.now() - started) / 1000;
      return { completed, tasksPerS: completed / seconds, cpuMsPerTask: cpu(completed) };
    };
    await database.db.execute(statement`vacuum tasks`);
    if (warmupTasks > 0) await drainIn(`floor-warmup-${stamp}`, warmupTasks);
    const r = await drainIn(`floor-1b-${stamp}`, tasks);
    figures.drainFloor = r.tasksPerS;
    print({
      scenario: "1b-floor-lease-store-in-process",
      database: "postgres",
      tasks: r.completed,
      workers,
      tasks_per_s: Math.round(r.tasksPerS),
      cpu_ms_per_task: r.cpuMsPerTask,
    });
  } finally {
    await database.close();
  }
}

/**
 * The floor under 2b: the rows CreateTasks of 1,000 writes, inserted by one
 * SQL statement made in this process, as graphile's add_jobs is (the specs
 * sent as one JSON parameter, every row returned, since CreateTasks answers
 * each task). No RPC, no validation: what the database alone allows. Then
 * the same statement for one task, serially: the floor under scenario 3's
 * create (an insert and its commit, the NOTIFY trigger included).
 */
async function insertFloor(co: Coordinator) {
  const sql = connectPostgres(co.databaseUrl, { max: 1, onnotice: () => {} });
  try {
    const workload = `floor-${Date.now()}`;
    const insert = (specs: string) => sql`
      insert into tasks (id, workload, required_capabilities, state, max_attempts,
        lease_seconds, backoff_initial_ms, backoff_max_ms, backoff_multiplier, correlation_id)
      select ${taskIdAt(sql, sql`now()`)}, s.workload, '{}', 'PENDING', 3, 60, 1000, 60000, 2, s.correlation_id
      from jsonb_to_recordset(${specs}::text::jsonb) as s(workload text, correlation_id text)
      returning *`;
    const specs = () =>
      JSON.stringify(
        Array.from({ length: 1000 }, () => ({ workload, correlation_id: randomUUID() })),
      );
    await insert(specs());
    const rounds = Math.max(1, Math.floor(tasks / 1000));
    const started = performance.now();
    for (let i = 0; i < rounds; i++) await insert(specs());
    figures.insertFloor = (rounds * 1000) / ((performance.now() - started) / 1000);
    // The floor under scenario 3's create: one task inserted and committed, serially.
    const one: number[] = [];
    for (let i = 0; i < latencySamples; i++) {
      const sent = performance.now();
      await insert(JSON.stringify([{ workload, correlation_id: randomUUID() }]));
      one.push(performance.now() - sent);
    }
    one.sort((a, b) => a - b);
    figures.insertOneP50 = quantile(one, 0.5);
    print({
      scenario: "2b-floor-sql-insert-1000",
      database: "postgres",
      tasks_per_s: Math.round(figures.insertFloor),
      one_task_serial_p50_ms: figures.insertOneP50,
      one_task_serial_p99_ms: quantile(one, 0.99),
    });
    await sql`delete from tasks where workload = ${workload}`;
  } finally {
    await sql.end();
  }
}

// ---------------------------------------------------------------- 4: held leases

/** An async queue of requests for a bidi stream. */
function requestQueue<T>() {
  const items: T[] = [];
  let wake: (() => void) | undefined;
  let closed = false;
  return {
    push(item: T) {
      items.push(item);
      wake?.();
    },
    close() {
      closed = true;
      wake?.();
    },
    async *[Symbol.asyncIterator]() {
      for (;;) {
        const item = items.shift();
        if (item !== undefined) {
          yield item;
          continue;
        }
        if (closed) return;
        await new Promise<void>((r) => {
          wake = r;
        });
        wake = undefined;
      }
    },
  };
}

type RequestInit = Partial<Omit<StreamLeasesRequest, "$typeName" | "leases">> & {
  leases?: { taskId: string; attempt: number; leaseToken: string }[];
};

/** One StreamLeases stream: send() resolves with the answer to that message. */
function leaseStream(co: Coordinator, signal: AbortSignal) {
  const c = clients(grpc(co));
  const queue = requestQueue<RequestInit>();
  const responses = c.leases.streamLeases(queue, { signal })[Symbol.asyncIterator]();
  return {
    c,
    async send(req: RequestInit): Promise<StreamLeasesResponse> {
      queue.push(req);
      const next = await responses.next();
      if (next.done) throw new Error("StreamLeases ended");
      return next.value;
    },
    close: () => queue.close(),
  };
}

async function leases() {
  const co = await startCoordinator("postgres", quiet);
  const sql = connectPostgres(co.databaseUrl, { max: 1, onnotice: () => {} });
  // Autovacuum is off on the benchmark machine: without this each drain
  // would run over the dead rows of the one before and the last be slowest.
  const vacuum = () => sql`vacuum tasks`;
  const abort = new AbortController();
  try {
    await warmUp(co);
    await vacuum();
    const before = await drain(co, { batch, tasks: leaseTasks, workers });
    // The held leases: another workload, claimed by other workers.
    const setup = clients(grpc(co));
    const workload = `held-${Date.now()}`;
    await enqueue(setup, workload, heldLeases, { leaseSeconds: 3600 });
    const share = Math.ceil(heldLeases / leaseStreams);
    const holders = await Promise.all(
      Array.from({ length: leaseStreams }, async () => {
        const stream = leaseStream(co, abort.signal);
        const { workerId } = await stream.c.fleet.registerWorker({
          capabilities: [workload],
          maxConcurrency: share,
        });
        const held: Claim[] = [];
        for (;;) {
          const { claims } = await stream.c.leases.claimTasks({
            workerId,
            maxTasks: Math.min(100, share - held.length),
          });
          held.push(...claims);
          if (claims.length === 0 || held.length >= share) break;
        }
        return { stream, workerId, held };
      }),
    );
    const holding = holders.reduce((n, h) => n + h.held.length, 0);
    if (holding !== heldLeases) throw new Error(`held ${holding} leases, wanted ${heldLeases}`);
    // Renewals: each stream every renewSeconds, staggered; the first at the drain's start.
    const renewals: number[] = [];
    let lost = 0;
    // The drain's tasks first, so that the renewals run beside the drain only.
    const drained = `drain-leases-${Date.now()}`;
    await enqueue(setup, drained, leaseTasks);
    await vacuum();
    let draining = true;
    const renewing = holders.map(async (h, i) => {
      await sleep((i * renewSeconds * 1000) / leaseStreams);
      while (draining) {
        const sent = performance.now();
        const res = await h.stream.send({
          workerId: h.workerId,
          leases: h.held.map((l) => ({
            taskId: l.taskId,
            attempt: l.attempt,
            leaseToken: l.leaseToken,
          })),
        });
        renewals.push(performance.now() - sent);
        lost += res.leases.filter((u) => u.status !== LeaseStatus.RENEWED).length;
        const next = sent + renewSeconds * 1000;
        while (draining && performance.now() < next) await sleep(50);
      }
    });
    const during = await drainWorkload(co, drained, { batch, tasks: leaseTasks, workers });
    draining = false;
    await Promise.all(renewing);
    for (const h of holders) h.stream.close();
    // Finish the held tasks, so that the last drain runs as the first did.
    for (const h of holders) {
      for (let i = 0; i < h.held.length; i += 1000) {
        await h.stream.c.leases.completeTasks({
          completions: h.held.slice(i, i + 1000).map((l) => ({
            taskId: l.taskId,
            workerId: h.workerId,
            attempt: l.attempt,
            leaseToken: l.leaseToken,
          })),
        });
      }
    }
    await vacuum();
    const after = await drain(co, { batch, tasks: leaseTasks, workers });
    const without = (before.tasksPerS + after.tasksPerS) / 2;
    figures.leases = during.tasksPerS / without;
    renewals.sort((a, b) => a - b);
    print({
      scenario: "4-drain-with-held-leases",
      database: co.database,
      transport: "grpc-h2c",
      tasks: leaseTasks,
      workers,
      batch,
      held_leases: heldLeases,
      lease_streams: leaseStreams,
      renew_every_s: renewSeconds,
      tasks_per_s_without_before: Math.round(before.tasksPerS),
      tasks_per_s_with: Math.round(during.tasksPerS),
      tasks_per_s_without_after: Math.round(after.tasksPerS),
      renewal_messages: renewals.length,
      leases_renewed: renewals.length * share,
      leases_lost: lost,
      renewal_p50_ms: quantile(renewals, 0.5),
      renewal_p99_ms: quantile(renewals, 0.99),
      ratio: round2(figures.leases),
    });
  } finally {
    abort.abort();
    await sql.end();
    await co.stop();
  }
}

// ---------------------------------------------------------------- 6: memory

async function idleRss(database: "postgres" | "pglite") {
  const co = await startCoordinator(database, quiet);
  try {
    await sleep(2000);
    const rss = rssOf(co.pid);
    figures[`rss_${database}`] = mib(rss);
    print({ scenario: "6-idle-rss", database, rss_mib: mib(rss) });
  } finally {
    await co.stop();
  }
}

async function loadedRss() {
  const co = await startCoordinator("postgres", quiet);
  const abort = new AbortController();
  // Every stream and long poll listens on it.
  setMaxListeners(0, abort.signal);
  try {
    // Each worker holds a stream and a long poll: 90 per connection, under
    // the coordinator's 100 streams per HTTP/2 connection.
    const connectionCount = Math.max(8, Math.ceil((2 * memoryWorkers) / 90));
    const connections = Array.from({ length: connectionCount }, () => clients(grpc(co)));
    const workload = `idle-${Date.now()}`;
    const ids: string[] = [];
    for (let i = 0; i < memoryWorkers; i += 50) {
      const n = Math.min(50, memoryWorkers - i);
      const got = await Promise.all(
        Array.from(
          { length: n },
          async (_, j) =>
            (
              await (
                connections[(i + j) % connectionCount] as (typeof connections)[0]
              ).fleet.registerWorker({
                capabilities: [workload],
              })
            ).workerId,
        ),
      );
      ids.push(...got);
    }
    const before = rssOf(co.pid);
    let settled = 0;
    const queues: ReturnType<typeof requestQueue<RequestInit>>[] = [];
    for (let i = 0; i < ids.length; i += 100) {
      await Promise.all(
        ids.slice(i, i + 100).map(async (workerId, j) => {
          const c = connections[(i + j) % connectionCount] as (typeof connections)[0];
          const queue = requestQueue<RequestInit>();
          queues.push(queue);
          const responses = c.leases
            .streamLeases(queue, { signal: abort.signal })
            [Symbol.asyncIterator]();
          queue.push({ workerId });
          const first = await responses.next();
          if (first.done) throw new Error("StreamLeases ended");
          // Keep reading so that the stream stays open; ends with the abort.
          (async () => {
            for (;;) if ((await responses.next()).done) return;
          })().catch(() => {});
          c.leases
            .claimTasks({ workerId, maxTasks: 1, waitSeconds: 30 }, { signal: abort.signal })
            .then(
              () => settled++,
              () => settled++,
            );
        }),
      );
    }
    await sleep(2000);
    const rss = rssOf(co.pid);
    figures.rss_loaded = mib(rss);
    print({
      scenario: "6-rss-with-streams-and-long-polls",
      database: co.database,
      workers: ids.length,
      open_streams: queues.length,
      parked_claims: ids.length - settled,
      http2_connections: connections.length,
      rss_mib_before_streams: mib(before),
      rss_mib: mib(rss),
    });
    for (const q of queues) q.close();
    abort.abort();
    // Let the coordinator see the cancelled calls before it is stopped.
    await sleep(1000);
  } finally {
    abort.abort();
    await co.stop();
  }
}

// ---------------------------------------------------------------- 7: backlog

async function backlogAt(pending: number) {
  const co = await startCoordinator("postgres", quiet);
  const sql = connectPostgres(co.databaseUrl, { max: 1, onnotice: () => {} });
  try {
    const [av] = await sql`show autovacuum`;
    const autovacuum = String(av?.autovacuum);
    figures.autovacuumOn = autovacuum === "on" ? 1 : 0;
    await warmUp(co);
    const workload = `backlog-${Date.now()}`;
    // What the measurement takes (a drain's last batches may overshoot), on top.
    const taken = backlogClaims * 32 + backlogDrain + workers * batch;
    const rows = pending + taken;
    const insertStarted = performance.now();
    // The columns the coordinator's CreateTasks sets (src/tasks/store.ts,
    // its defaults of src/tasks/convert.ts), the table's defaults for the rest.
    await sql`
      insert into tasks (id, workload, state, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier, created_at, updated_at)
      select ${taskIdAt(sql, sql`s.at`)}, ${workload}, 'PENDING', 3, 60, 1000, 300000, 2, s.at, s.at
      from generate_series(1, ${rows}::int) g,
        lateral (select now() - (${rows}::int - g) * interval '1 millisecond' as at) s`;
    const insertSeconds = (performance.now() - insertStarted) / 1000;
    // The insert's own writes are flushed before anything is measured: the
    // checkpoint a 1,000,000-row insert brings on otherwise lands in the
    // middle of the claims (p99 168 ms, the drain at a quarter of its rate,
    // in a run without it), which measures the disk, not the claim.
    const checkpointStarted = performance.now();
    await sql`checkpoint`;
    const checkpointSeconds = (performance.now() - checkpointStarted) / 1000;
    // Serial claims of 32 by one worker, each followed by its CompleteTasks.
    const c = clients(grpc(co));
    const { workerId } = await c.fleet.registerWorker({
      capabilities: [workload],
      maxConcurrency: 32,
    });
    const claimMs: number[] = [];
    const completeMs: number[] = [];
    for (let i = 0; i < backlogClaims; i++) {
      const t0 = performance.now();
      const { claims } = await c.leases.claimTasks({ workerId, maxTasks: 32 });
      const t1 = performance.now();
      if (claims.length !== 32) throw new Error(`a claim got ${claims.length} tasks, not 32`);
      await c.leases.completeTasks({
        completions: completionsOf(claims, workerId),
      });
      claimMs.push(t1 - t0);
      completeMs.push(performance.now() - t1);
    }
    claimMs.sort((a, b) => a - b);
    completeMs.sort((a, b) => a - b);
    const d = await drainWorkload(co, workload, { batch, tasks: backlogDrain, workers });
    const [left] = await sql`select count(*)::int as n from tasks where state = 'PENDING'`;
    const key = pending === backlogBig ? "big" : "small";
    figures[`backlog_${key}_p50`] = quantile(claimMs, 0.5);
    figures[`backlog_${key}_p99`] = quantile(claimMs, 0.99);
    figures[`backlog_${key}_1b`] = d.tasksPerS;
    print({
      scenario: "7-backlog",
      database: co.database,
      autovacuum,
      analyzed: false,
      backlog_pending: pending,
      rows_inserted: rows,
      insert_seconds: round2(insertSeconds),
      checkpoint_seconds: round2(checkpointSeconds),
      claims: backlogClaims,
      claim32_p50_ms: quantile(claimMs, 0.5),
      claim32_p99_ms: quantile(claimMs, 0.99),
      completeTasks32_p50_ms: quantile(completeMs, 0.5),
      drain_tasks: d.completed,
      drain_workers: workers,
      drain_batch: batch,
      drain_tasks_per_s: Math.round(d.tasksPerS),
      pending_after: left?.n,
    });
  } finally {
    await sql.end();
    await co.stop();
  }
}

// ---------------------------------------------------------------- history

/**
 * Retention's target: 1b on a database that BENCH_HISTORY tasks have gone
 * through (finished within the retention window, so still kept), against
 * the same drain on a fresh database. The finished tasks are inserted with
 * SQL as CompleteTasks leaves them (SUCCEEDED, attempt 1, lease ended),
 * finished over the last hour; no ANALYZE; `VACUUM tasks` before each
 * drain, as autovacuum would have run after such a history.
 *
 * Both coordinators stay up and their drains alternate, fresh then after,
 * BENCH_HISTORY_ROUNDS (3) times; each figure is the median of its
 * drains. One drain of each, one after the other, put the ratio anywhere
 * between 0.93 and 1.56 in three runs within 80 minutes, with no change
 * on its path between them.
 */
async function historyAt(done: number) {
  const co = await startCoordinator("postgres", quiet);
  const sql = connectPostgres(co.databaseUrl, { max: 1, onnotice: () => {} });
  const stop = async () => {
    await sql.end();
    await co.stop();
  };
  try {
    await warmUp(co);
    if (done > 0) {
      const workload = `history-${Date.now()}`;
      await sql`
        insert into tasks (id, workload, state, attempt, max_attempts, lease_seconds,
          backoff_initial_ms, backoff_max_ms, backoff_multiplier,
          created_at, updated_at, started_at, finished_at)
        select ${taskIdAt(sql, sql`s.at`)}, ${workload}, 'SUCCEEDED', 1, 3, 60, 1000, 300000, 2,
          s.at, s.at, s.at, s.at
        from generate_series(1, ${done}::int) g,
          lateral (select now() - interval '1 hour' + g * interval '3 microseconds' as at) s`;
    }
  } catch (error) {
    await stop();
    throw error;
  }
  const c = clients(grpc(co));
  /** One 1b drain of BENCH_BACKLOG_DRAIN new tasks: tasks/s and the tasks it completed. */
  const drainOnce = async (): Promise<{ tasksPerS: number; completed: number }> => {
    await sql`vacuum tasks`;
    const workload = `history-drain-${Date.now()}`;
    for (let n = 0; n < backlogDrain; n += 1000) {
      await c.tasks.createTasks({
        tasks: Array.from({ length: Math.min(1000, backlogDrain - n) }, () => ({ workload })),
      });
    }
    await sql`vacuum tasks`;
    const d = await drainWorkload(co, workload, { batch, tasks: backlogDrain, workers });
    return { tasksPerS: d.tasksPerS, completed: d.completed };
  };
  return { done, drainOnce, stop };
}

async function history() {
  const fresh = await historyAt(0);
  try {
    const after = await historyAt(historyDone);
    try {
      const drains = { fresh: [] as number[], after: [] as number[] };
      let completed = Number.POSITIVE_INFINITY;
      const cases = [
        ["fresh", fresh],
        ["after", after],
      ] as const;
      for (let round = 0; round < historyRounds; round++) {
        for (const [key, h] of cases) {
          const d = await h.drainOnce();
          drains[key].push(Math.round(d.tasksPerS));
          completed = Math.min(completed, d.completed);
        }
      }
      for (const [key, h] of cases) {
        // The middle drain (BENCH_HISTORY_ROUNDS is odd by default).
        const median = quantile(
          [...drains[key]].sort((a, b) => a - b),
          0.5,
        );
        figures[key === "after" ? "history_big_1b" : "history_fresh_1b"] = median;
        print({
          scenario: "history-1b",
          database: "postgres",
          finished_tasks_before: h.done,
          drain_tasks: completed,
          drain_workers: workers,
          drain_batch: batch,
          drain_tasks_per_s: median,
          drains_tasks_per_s: drains[key],
        });
      }
    } finally {
      await after.stop();
    }
  } finally {
    await fresh.stop();
  }
}

// ---------------------------------------------------------------- 8: sweep

async function sweep() {
  const points: SweepPoint[] = [];
  for (const w of [1, 4, 16, 64]) {
    for (const b of [1, 8, 32, 100]) {
      // Enough tasks for about 10 claims per worker, within the bounds.
      const n = Math.min(sweepMax, Math.max(sweepTasks, w * b * 10));
      const co = await startCoordinator("postgres", quiet);
      try {
        await warmUp(co);
        const r = await drain(co, { batch: b, tasks: n, workers: w, completeMany: true });
        const point = {
          workers: w,
          batch: b,
          tasks: r.completed,
          tasks_per_s: Math.round(r.tasksPerS),
        };
        points.push(point);
        print({ scenario: "8-sweep-1b", database: "postgres", ...point });
      } finally {
        await co.stop();
      }
    }
  }
  const date = new Date().toISOString().slice(0, 10);
  const results: SweepResults = { date, database: "postgres", points };
  const file = `bench/results/sweep-${date}.json`;
  mkdirSync("bench/results", { recursive: true });
  writeFileSync(file, `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync("bench/sweep.svg", drawSweep(results));
  print({ scenario: "8-sweep-written", json: file, svg: "bench/sweep.svg" });
}

// ---------------------------------------------------------------- the run

/** Runs a part when selected, saying on stderr how long it took. */
async function part(name: string, body: () => Promise<void>) {
  if (!parts.includes(name)) return;
  const started = performance.now();
  await body();
  process.stderr.write(
    `bench:compare: ${name} took ${Math.round((performance.now() - started) / 1000)} s\n`,
  );
}

await part("graphile", graphile);
await part("bloat", async () => {
  for (const vacuum of ["on", "off"] as const) {
    const r = await bloatThrough(vacuum);
    figures[`bloat_${vacuum}_p50`] = r.after.p50 / r.fresh.p50;
    figures[`bloat_${vacuum}_1b`] = r.fresh.drain / r.after.drain;
  }
});
await part("pinned", async () => {
  const p = await bloatPinned();
  figures.pinned_p50 = p.lastP50 / p.firstP50;
  figures.pinned_1b = p.firstRate / p.lastRate;
});
await part("peers", async () => {
  const results = [
    await pgBoss(tasks, workers),
    await bullmq(tasks, workers, "redis"),
    await bullmq(tasks, workers, "postgres"),
  ];
  for (const r of results) {
    figures[`peer_${r.name}_add`] = r.addPerS;
    figures[`peer_${r.name}_drain`] = r.drainPerS;
    print({
      scenario: `peer-${r.name}`,
      version: r.version,
      store: r.store,
      jobs: tasks,
      concurrency: workers,
      add_jobs_per_s: Math.round(r.addPerS),
      drain_jobs_per_s: Math.round(r.drainPerS),
      seconds: r.drainSeconds,
      cpu_ms_per_job: r.cpuMsPerJob,
    });
  }
});
await part("postgres", async () => {
  const co = await startCoordinator("postgres", quiet);
  try {
    await drains(co, "pg");
  } finally {
    await co.stop();
  }
});
await part("ceiling", async () => {
  const co = await startCoordinator("postgres", quiet);
  try {
    await ceiling(co);
  } finally {
    await co.stop();
  }
});
await part("leases", leases);
await part("pglite", async () => {
  const co = await startCoordinator("pglite", quiet);
  try {
    await drains(co, "lite");
  } finally {
    await co.stop();
  }
});
await part("memory", async () => {
  await idleRss("postgres");
  await idleRss("pglite");
  await loadedRss();
});
await part("backlog", async () => {
  await backlogAt(backlogSmall);
  await backlogAt(backlogBig);
});
await part("history", history);
await part("scheduling", () => scheduling(figures, { workers, batch }));
await part("sweep", sweep);

// ---------------------------------------------------------------- the table

interface Row {
  what: string;
  value: number | undefined;
  target: string;
  met: (v: number) => boolean;
}
const f = figures;
const ratio = (a?: number, b?: number) =>
  a === undefined || b === undefined || b === 0 ? undefined : a / b;
const atLeast = (t: number) => (v: number) => v >= t;
const atMost = (t: number) => (v: number) => v <= t;
const info = (what: string, value: number | undefined): Row => ({
  what,
  value,
  target: "(info)",
  met: () => true,
});
/** Tasks/s the two cores allow when each task costs `ms` of CPU in all. */
const cpuBound = (ms?: number) => (ms ? (availableParallelism() * 1000) / ms : undefined);
const rows: Row[] = [
  {
    what: "1b ÷ graphile-worker (drain)",
    value: ratio(f.pg1b, f.graphile),
    target: "≥ 2",
    met: atLeast(2),
  },
  ...["pg-boss", "bullmq-redis", "bullmq-postgres"].flatMap((peer): Row[] => [
    {
      what: `1b ÷ ${peer} (drain)`,
      value: ratio(f.pg1b, f[`peer_${peer}_drain`]),
      target: "≥ 1",
      met: atLeast(1),
    },
    {
      what: `2b CreateTasks ÷ ${peer} (add)`,
      value: ratio(f.pg2b, f[`peer_${peer}_add`]),
      target: "≥ 1",
      met: atLeast(1),
    },
  ]),
  {
    what: "2b CreateTasks ÷ graphile add_jobs",
    value: ratio(f.pg2b, f.graphileAdd),
    target: "≥ 1",
    met: atLeast(1),
  },
  {
    what: "1a ÷ (transport ceiling ÷ 2)",
    value: ratio(f.pg1a, f.ceiling === undefined ? undefined : f.ceiling / 2),
    target: "≥ 0.8",
    met: atLeast(0.8),
  },
  info("1b CPU ms per task, coordinator", f.pg1bCoordinatorCpu),
  info("1b CPU ms per task, PostgreSQL + workers", f.pg1bOthersCpu),
  info("graphile CPU ms per job, all", f.graphileCpu),
  info(
    "1b ÷ graphile if the coordinator cost only the bare transport",
    ratio(
      cpuBound(
        f.pg1bOthersCpu === undefined || f.ceilingServerCpu === undefined
          ? undefined
          : f.pg1bOthersCpu + (2 * f.ceilingServerCpu) / batch,
      ),
      f.graphile,
    ),
  ),
  {
    what: "1b ÷ its floor (the lease store in process, no RPC)",
    value: ratio(f.pg1b, f.drainFloor),
    target: "≥ 0.8",
    met: atLeast(0.8),
  },
  info("1b floor ÷ graphile-worker", ratio(f.drainFloor, f.graphile)),
  info("2b floor: the same insert in SQL ÷ add_jobs", ratio(f.insertFloor, f.graphileAdd)),
  info("bare transport CPU ms per call", f.ceilingCpu),
  info(
    "1a ÷ (ceiling ÷ 2) if the coordinator cost only the bare transport",
    ratio(
      cpuBound(
        f.ceilingCpu === undefined || f.pg1aPostgresCpu === undefined
          ? undefined
          : 2 * f.ceilingCpu + f.pg1aPostgresCpu,
      ),
      f.ceiling === undefined ? undefined : f.ceiling / 2,
    ),
  ),
  {
    what: "Health/Check through Meshwork ÷ ceiling",
    value: ratio(f.health, f.ceiling),
    target: "(info)",
    met: () => true,
  },
  {
    what: "server CPU per no-op call, Meshwork ÷ bare connect-node (median of rounds)",
    value: f.serverCpuRatio,
    target: "≤ 1.2",
    met: atMost(1.2),
  },
  {
    what: "3 PostgreSQL p50 ÷ graphile-worker add→start p50",
    value: ratio(f.pgp50, f.graphileStartP50),
    target: "≤ 1",
    met: atMost(1),
  },
  info("3 PostgreSQL p50 ms", f.pgp50),
  info("3 graphile-worker add→start p50 ms", f.graphileStartP50),
  info("3 bare transport, one serial call p50 ms", f.ceilingSerialP50),
  info("3 one task inserted in SQL, serial p50 ms", f.insertOneP50),
  info("3 Meshwork's own stack, one serial Health/Check p50 ms", f.healthSerialP50),
  info(
    "3 floor: 1.5 serial Health/Checks + the insert (ms)",
    f.healthSerialP50 === undefined || f.insertOneP50 === undefined
      ? undefined
      : 1.5 * f.healthSerialP50 + f.insertOneP50,
  ),
  { what: "3 PostgreSQL p99 ms", value: f.pgp99, target: "≤ 10", met: atMost(10) },
  { what: "3 PGlite p50 ms", value: f.litep50, target: "≤ 5", met: atMost(5) },
  { what: "3 PGlite p99 ms", value: f.litep99, target: "≤ 20", met: atMost(20) },
  {
    what: `4 1b with ${heldLeases} held leases ÷ without`,
    value: f.leases,
    target: "≥ 0.9",
    met: atLeast(0.9),
  },
  {
    what: "5 PGlite ÷ PostgreSQL, 1a",
    value: ratio(f.lite1a, f.pg1a),
    target: "≥ 0.5",
    met: atLeast(0.5),
  },
  {
    what: "5 PGlite ÷ PostgreSQL, 1b",
    value: ratio(f.lite1b, f.pg1b),
    target: "≥ 0.5",
    met: atLeast(0.5),
  },
  {
    what: "6 idle RSS, PostgreSQL (MiB)",
    value: f.rss_postgres,
    target: "≤ 150",
    met: atMost(150),
  },
  { what: "6 idle RSS, PGlite (MiB)", value: f.rss_pglite, target: "≤ 300", met: atMost(300) },
  {
    what: `6 RSS, ${memoryWorkers} streams + long polls (MiB)`,
    value: f.rss_loaded,
    target: "≤ 300",
    met: atMost(300),
  },
  {
    what: `7 claim p50, ${backlogBig} ÷ ${backlogSmall} pending`,
    value: ratio(f.backlog_big_p50, f.backlog_small_p50),
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: `7 claim p99, ${backlogBig} ÷ ${backlogSmall} pending`,
    value: ratio(f.backlog_big_p99, f.backlog_small_p99),
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: `7 1b tasks/s, ${backlogSmall} ÷ ${backlogBig} pending`,
    value: ratio(f.backlog_small_1b, f.backlog_big_1b),
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: `1b tasks/s, fresh ÷ after ${historyDone} finished tasks`,
    value: ratio(f.history_fresh_1b, f.history_big_1b),
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: "bloat: claim p50 after BENCH_BLOAT tasks went through ÷ fresh (--vacuum on)",
    value: f.bloat_on_p50,
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: "bloat: 1b fresh ÷ after BENCH_BLOAT tasks went through (--vacuum on)",
    value: f.bloat_on_1b,
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  info("bloat: the same claim p50 ratio with --vacuum off", f.bloat_off_p50),
  info("bloat: the same 1b ratio with --vacuum off", f.bloat_off_1b),
  {
    what: "pinned horizon: claim p50, last tenth ÷ first tenth of the drain",
    value: f.pinned_p50,
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: "pinned horizon: 1b, first tenth ÷ last tenth of the drain",
    value: f.pinned_1b,
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: "9 1b tasks/s, plain ÷ with shares, 10 resources, selectors",
    value: f.sched1bRatio === undefined ? undefined : 1 / f.sched1bRatio,
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: "9 claim p50, with shares, 10 resources, selectors ÷ plain",
    value: f.schedP50Ratio,
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: "9 claim p99, with shares, 10 resources, selectors ÷ plain",
    value: f.schedP99Ratio,
    target: "≤ 1.5",
    met: atMost(1.5),
  },
  {
    what: "9 fair share 1:2:1, largest error (points)",
    value: f.fairShareError,
    target: "≤ 5",
    met: atMost(5),
  },
];
const measured = rows.filter((r) => r.value !== undefined).length > 0;
const table = rows.map((r) => [
  r.what,
  // Three significant digits: a ratio of 0.298 must not read as 0.3 beside "NO".
  r.value === undefined ? "not measured" : String(Number(r.value.toPrecision(3))),
  r.target,
  r.value === undefined ? "—" : r.met(r.value) ? (r.target === "(info)" ? "—" : "yes") : "NO",
]);
const header = ["measure", "value", "target", "met"];
const widths = header.map((h, i) => Math.max(h.length, ...table.map((r) => (r[i] ?? "").length)));
const line = (cells: string[]) =>
  `| ${cells.map((c, i) => c.padEnd(widths[i] ?? 0)).join(" | ")} |`;
if (measured) {
  process.stdout.write(
    `\n${[line(header), line(widths.map((w) => "-".repeat(w))), ...table.map(line)].join("\n")}\n`,
  );
}
if (f.autovacuumOn !== undefined) {
  process.stdout.write(`(autovacuum was ${f.autovacuumOn ? "on" : "off"} for scenario 7)\n`);
}
