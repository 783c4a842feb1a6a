/**
 * What `npm run bench` (bench/run.ts) and `npm run bench:compare`
 * (bench/compare.ts) share: a coordinator started as its own process
 * (`meshwork serve`, auth on), gRPC (h2c) clients presenting its admin
 * token, the drain (scenario 1) and the create→claim latency (scenario 3).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Client, createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, type GrpcTransportOptions } from "@connectrpc/connect-node";
import type postgres from "postgres";
import { FleetService } from "../gen/meshwork/v1/fleet_pb.js";
import { type Claim, LeaseService } from "../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../gen/meshwork/v1/task_pb.js";
import { connectPostgres } from "../src/db/postgres-client.js";

export const pgUrl = process.env.BENCH_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";

export interface Coordinator {
  url: string;
  database: "postgres" | "pglite";
  /** The coordinator's own database (PostgreSQL only; "" on PGlite). */
  databaseUrl: string;
  pid: number;
  /** The admin token the coordinator wrote on its first start: every call presents it (auth on). */
  token: string;
  stop(): Promise<void>;
}

/**
 * A task id of the layout the coordinator gives them (src/core/ids.ts), in
 * SQL: a UUID version 7 of the time `at` (a timestamptz fragment), the
 * rest random (so ids of one millisecond are not in the order made, as
 * the coordinator's are). PostgreSQL 15 has no uuidv7(). With random ids
 * the index entries of tasks the bench inserts by SQL would sit apart, as
 * the coordinator's own no longer do, and a claim would touch a page per
 * task (the backlog part measured that).
 */
export function taskIdAt(sql: postgres.Sql, at: postgres.PendingQuery<postgres.Row[]>) {
  return sql`(lpad(to_hex(floor(extract(epoch from ${at}) * 1000)::bigint), 12, '0') || '7'
    || substr(md5(random()::text), 1, 3) || substr('89ab', 1 + floor(random() * 4)::int, 1)
    || substr(md5(random()::text), 1, 15))::uuid`;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

/** PostgreSQL URL `base` with its database replaced by `name`. */
export function databaseUrl(base: string, name: string): string {
  const url = new URL(base);
  url.pathname = `/${name}`;
  return url.toString();
}

/**
 * Starts `meshwork serve` on a free port with a fresh data directory and,
 * on PostgreSQL, a fresh database (dropped by stop()); resolves once
 * /readyz answers 200. Its log lines (level warn) go to this process's
 * stdout, or to its stderr with `logsToStderr`.
 */
export async function startCoordinator(
  database: "postgres" | "pglite",
  options: { logsToStderr?: boolean; args?: string[] } = {},
): Promise<Coordinator> {
  const port = await freePort();
  const dataDir = mkdtempSync(join(tmpdir(), "meshwork-bench-"));
  let dbName = "";
  let dbUrl = "";
  let admin: postgres.Sql | undefined;
  const childEnv: NodeJS.ProcessEnv = { ...process.env, MESHWORK_LOG_LEVEL: "warn" };
  delete childEnv.DATABASE_URL;
  if (database === "postgres") {
    dbName = `meshwork_bench_${process.pid}_${Date.now()}`;
    admin = connectPostgres(pgUrl, { max: 1, onnotice: () => {} });
    await admin.unsafe(`create database ${dbName}`);
    dbUrl = databaseUrl(pgUrl, dbName);
    childEnv.DATABASE_URL = dbUrl;
  }
  const child: ChildProcess = spawn(
    process.execPath,
    [
      // BENCH_NODE_ARGS: extra node flags for the coordinator, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof".
      ...(process.env.BENCH_NODE_ARGS ? process.env.BENCH_NODE_ARGS.split(" ") : []),
      "bin/meshwork.js",
      "serve",
      "--listen",
      `127.0.0.1:${port}`,
      "--data-dir",
      dataDir,
      ...(options.args ?? []),
    ],
    {
      env: childEnv,
      // The coordinator logs on its stdout: on ours unless asked (bench:compare keeps its stdout to JSON lines).
      stdio: ["ignore", options.logsToStderr ? process.stderr : "inherit", "inherit"],
    },
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
    databaseUrl: dbUrl,
    pid: child.pid ?? 0,
    token: readFileSync(join(dataDir, "admin.token"), "utf8").trim(),
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

/** A gRPC (h2c) transport to `baseUrl` that presents `token`: one HTTP/2 connection. */
export function grpcTo(
  baseUrl: string,
  token: string,
  options: Partial<GrpcTransportOptions> = {},
): Transport {
  const bearer: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
  return createGrpcTransport({ ...options, baseUrl, interceptors: [bearer] });
}

/** A gRPC (h2c) transport to the coordinator that presents its admin token. */
export function grpc(co: Coordinator, options: Partial<GrpcTransportOptions> = {}): Transport {
  return grpcTo(co.url, co.token, options);
}

export interface Clients {
  fleet: Client<typeof FleetService>;
  tasks: Client<typeof TaskService>;
  leases: Client<typeof LeaseService>;
}

export function clients(transport: Transport): Clients {
  return {
    fleet: createClient(FleetService, transport),
    tasks: createClient(TaskService, transport),
    leases: createClient(LeaseService, transport),
  };
}

export function print(line: Record<string, unknown>) {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

export const round2 = (x: number) => Math.round(x * 100) / 100;

/** The p-th quantile (0–1) of ascending `sorted`, in its unit, 2 decimals. */
export function quantile(sorted: number[], p: number): number {
  return round2(sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? 0);
}

/** Creates `n` tasks of `workload`, 1,000 per CreateTasks call; returns tasks/s. */
export async function enqueue(
  c: Clients,
  workload: string,
  n: number,
  extra: { leaseSeconds?: number } = {},
): Promise<number> {
  const started = performance.now();
  for (let done = 0; done < n; done += 1000) {
    const count = Math.min(1000, n - done);
    await c.tasks.createTasks({
      tasks: Array.from({ length: count }, () => ({ workload, ...extra })),
    });
  }
  return n / ((performance.now() - started) / 1000);
}

/** The CompleteTasks entries that complete every claim of `workerId`, with its tokens. */
export function completionsOf(claims: readonly Claim[], workerId: string) {
  return claims.map((c) => ({
    taskId: c.taskId,
    workerId,
    attempt: c.attempt,
    leaseToken: c.leaseToken,
  }));
}

export interface DrainOptions {
  /** max_tasks of each claim (and the workers' max_concurrency). */
  batch: number;
  /** Stop once this many tasks are completed. */
  tasks: number;
  workers: number;
  /**
   * One CompleteTasks per claim (1b); false: one CompleteTask per task (1a).
   * Default: batch > 1.
   */
  completeMany?: boolean;
  /** What worker `i` registers besides its workload and max_concurrency (capacity, labels). */
  register?: (i: number) => { capacity?: Record<string, bigint>; labels?: Record<string, string> };
  /** Each claim's time, in ms, when given (the scheduling bench's probe). */
  claimMs?: number[];
}

/**
 * `workers` workers, each on its own HTTP/2 connection, claim and complete
 * tasks of `workload` until `tasks` are completed (a worker's last batch may
 * overshoot; the rate counts what was completed). Returns tasks/s.
 */
export async function drainWorkload(co: Coordinator, workload: string, o: DrainOptions) {
  const completeMany = o.completeMany ?? o.batch > 1;
  let completed = 0;
  const started = performance.now();
  const cpu = cpuMeter(co.pid, co.database === "postgres");
  await Promise.all(
    Array.from({ length: o.workers }, async (_, i) => {
      const c = clients(grpc(co));
      const { workerId } = await c.fleet.registerWorker({
        capabilities: [workload],
        maxConcurrency: o.batch,
        ...o.register?.(i),
      });
      while (completed < o.tasks) {
        const t0 = performance.now();
        const { claims } = await c.leases.claimTasks({ workerId, maxTasks: o.batch });
        if (claims.length > 0) o.claimMs?.push(performance.now() - t0);
        if (claims.length === 0) {
          await new Promise((r) => setTimeout(r, 5));
          continue;
        }
        if (!completeMany) {
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
            completions: completionsOf(claims, workerId),
          });
          if (results.some((r) => r.outcome.case !== "task"))
            throw new Error("a completion was refused");
        }
        completed += claims.length;
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  return { completed, seconds, tasksPerS: completed / seconds, cpuMsPerTask: cpu(completed) };
}

/** Scenario 1: enqueue `tasks` tasks (CreateTasks of 1,000), then drain them all. */
export async function drain(co: Coordinator, o: DrainOptions) {
  const setup = clients(grpc(co));
  const workload = `drain-${o.batch}-${Date.now()}`;
  const enqueueRate = await enqueue(setup, workload, o.tasks);
  const r = await drainWorkload(co, workload, o);
  return { ...r, enqueueRate };
}

/** The name scenario 1 prints for a drain of claims of `batch`. */
export function drainScenario(batch: number): string {
  return batch === 1 ? "1a-drain-claim1-complete1" : `1b-drain-claim${batch}-completeTasks`;
}

/** Scenario 3: one idle worker long-polls; serial CreateTask; create→claim latency in ms. */
export async function latency(co: Coordinator, samplesWanted: number) {
  const creator = clients(grpc(co));
  const worker = clients(grpc(co));
  const workload = `latency-${Date.now()}`;
  const { workerId } = await worker.fleet.registerWorker({ capabilities: [workload] });
  const samples: number[] = [];
  for (let i = 0; i < samplesWanted; i++) {
    const polling = worker.leases.claimTasks({ workerId, maxTasks: 1, waitSeconds: 30 });
    // Let the long poll reach the server and start waiting.
    await new Promise((r) => setTimeout(r, 2));
    const sent = performance.now();
    await creator.tasks.createTask({ workload });
    const { claims } = await polling;
    if (claims.length !== 1) throw new Error("the long poll returned no task");
    samples.push(performance.now() - sent);
    const [claim] = claims;
    if (claim) {
      await worker.leases.completeTask({ taskId: claim.taskId, workerId, attempt: claim.attempt });
    }
  }
  samples.sort((a, b) => a - b);
  return {
    samples: samples.length,
    p50_ms: quantile(samples, 0.5),
    p99_ms: quantile(samples, 0.99),
    max_ms: quantile(samples, 1),
  };
}

/** CPU seconds (user + system) a process has used so far (Linux; 0 once it is gone). */
export function cpuSecondsOf(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / clockTicks;
  } catch {
    return 0;
  }
}

/** Linux counts /proc CPU times in USER_HZ ticks: 100 per second on every common build. */
const clockTicks = 100;

/**
 * CPU seconds used so far by every PostgreSQL process on this machine
 * (server, backends, background workers); a backend that has exited no
 * longer counts, so measure while the connections stay open.
 */
export function postgresCpuSeconds(): number {
  let total = 0;
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/comm`, "utf8").trim() === "postgres") {
        total += cpuSecondsOf(Number(entry));
      }
    } catch {
      // gone meanwhile
    }
  }
  return total;
}

/**
 * Where the CPU of a measured stretch went: starts counting at once; the
 * function it returns gives milliseconds of CPU per unit of work (a task,
 * a call) for this process (the clients), the coordinator (when its pid is
 * given) and PostgreSQL (every postgres process, or none on PGlite, whose
 * database runs inside the coordinator).
 */
export function cpuMeter(coordinatorPid?: number, onPostgres = true) {
  const client = process.cpuUsage();
  const coordinator = coordinatorPid ? cpuSecondsOf(coordinatorPid) : 0;
  const pg = onPostgres ? postgresCpuSeconds() : 0;
  return (units: number) => {
    const used = process.cpuUsage(client);
    const perUnit = (seconds: number) => Math.round(((seconds * 1000) / units) * 1000) / 1000;
    return {
      client: perUnit((used.user + used.system) / 1e6),
      ...(coordinatorPid && {
        coordinator: perUnit(cpuSecondsOf(coordinatorPid) - coordinator),
      }),
      ...(onPostgres && { postgres: perUnit(postgresCpuSeconds() - pg) }),
    };
  };
}

/** Resident memory of a process, in bytes (Linux). */
export function rssOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = /VmRSS:\s+(\d+) kB/.exec(status)?.[1];
  return Number(kb ?? 0) * 1024;
}

/**
 * A database of its own (`<prefix>_<pid>`, made anew) for `body`, dropped
 * after it once its last connections left: a library's pool may close them
 * after its stop(), and dropping the database under them would end them
 * with an error it does not handle.
 */
export async function withDatabase<T>(
  prefix: string,
  body: (url: string) => Promise<T>,
): Promise<T> {
  const name = `${prefix}_${process.pid}`;
  const admin = connectPostgres(pgUrl, { max: 1, onnotice: () => {} });
  await admin.unsafe(`drop database if exists ${name} with (force)`);
  await admin.unsafe(`create database ${name}`);
  try {
    return await body(databaseUrl(pgUrl, name));
  } finally {
    for (let i = 0; i < 100; i++) {
      const [row] =
        await admin`select count(*)::int as n from pg_stat_activity where datname = ${name}`;
      if (row?.n === 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    await admin.unsafe(`drop database if exists ${name} with (force)`);
    await admin.end();
  }
}
