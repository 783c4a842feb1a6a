/**
 * The fault suite (`npm run faults`, `npm run faults -- --short` in CI):
 * real coordinator processes on loopback, hurt the way production hurts
 * them, with the proof read from the database afterwards. Every scenario is
 * bounded in time. Runs on PGlite, and on PostgreSQL when DATABASE_URL is
 * set (the replicas, the connection storm and the soak only there).
 *
 * Proof: before the coordinator first starts, a trigger is installed that
 * records every change of a task's state or attempt, with the lease it
 * replaced and the time. Afterwards the checks count tasks by state and read
 * that record: every task SUCCEEDED exactly once, no SUCCEEDED row ever
 * changed again, no (task, attempt) was leased twice, and a lost lease was
 * taken back only after it expired and soon after.
 *
 * `--only kill,replicas,storm,pool,dead-workers,soak,pg-restart,flood,bad-tokens,revoke,burst,disk-full,corrupt`
 * runs some scenarios only.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { type SQL, sql } from "drizzle-orm";
import { openDatabase } from "../../src/db/database.js";
import { connectPostgres } from "../../src/db/postgres-client.js";
import { postgresTarget } from "../../src/db/postgres-url.js";
import { rowsOf } from "../../src/db/values.js";
import {
  badTokens,
  burst,
  corrupt,
  diskFull,
  flood,
  type HostileContext,
  revoke,
} from "./hostile.js";
import { poolExhaustion } from "./pool-exhaustion.js";

type Engine = "pglite" | "postgres";

const short = process.argv.includes("--short");
const onlyArg = process.argv.indexOf("--only");
const only = onlyArg > 0 ? (process.argv[onlyArg + 1] ?? "").split(",") : undefined;
const pgUrl = process.env.DATABASE_URL || undefined;
/** Lease of every task the suite creates: the shortest the API accepts, so that expiry stays quick. */
const leaseSeconds = 5;
let passed = 0;
let failed = 0;

function check(name: string, ok: boolean, detail = ""): void {
  if (ok) passed++;
  else failed++;
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? `: ${detail}` : ""}`);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const secs = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
const mib = (bytes: number) => `${Math.round(bytes / 2 ** 20)} MiB`;

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

// Everything the suite starts, so that it is all ended however the suite ends.
const children = new Set<ChildProcess>();
const places = new Set<Place>();

function spawnTracked(args: string[], options: Parameters<typeof spawn>[2]): ChildProcess {
  const child = spawn(process.execPath, args, options);
  children.add(child);
  child.on("exit", () => children.delete(child));
  return child;
}

function killAll(): void {
  for (const child of children) child.kill("SIGKILL");
}

process.on("exit", killAll);
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    killAll();
    void dropAll().finally(() => process.exit(130));
  });
}

/** Where a scenario's coordinators keep their data: data dirs, and a fresh PostgreSQL database or none. */
interface Place {
  engine: Engine;
  dataDir: string;
  url: string | undefined;
  /** Another data dir (a replica's) on the same database. */
  newDataDir(): string;
  drop(): Promise<void>;
}

async function place(engine: Engine): Promise<Place> {
  const dirs: string[] = [];
  const newDataDir = () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-faults-"));
    dirs.push(dir);
    return dir;
  };
  const dataDir = newDataDir();
  let name = "";
  let url: string | undefined;
  if (engine === "postgres") {
    name = `meshwork_faults_${randomBytes(4).toString("hex")}`;
    const admin = connectPostgres(pgUrl ?? "", { max: 1, onnotice: () => {} });
    await admin.unsafe(`create database ${name}`);
    await admin.end();
    const u = new URL(pgUrl ?? "");
    u.pathname = `/${name}`;
    url = u.toString();
  }
  const p: Place = {
    engine,
    dataDir,
    url,
    newDataDir,
    async drop() {
      places.delete(p);
      if (name) {
        const admin = connectPostgres(pgUrl ?? "", { max: 1, onnotice: () => {} });
        await admin.unsafe(`drop database if exists ${name} with (force)`);
        await admin.end();
      }
      for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
    },
  };
  places.add(p);
  return p;
}

async function dropAll(): Promise<void> {
  for (const p of [...places]) await p.drop().catch((e) => console.log(`drop: ${e}`));
}

/** A PostgreSQL connection to the place's database, for reading it while coordinators run. */
function connect(p: Place) {
  return connectPostgres(p.url ?? "", { max: 1, onnotice: () => {} });
}

/** Migrates the database and installs the audit trigger, before any coordinator runs. */
async function installAudit(p: Place): Promise<void> {
  const database = await openDatabase({ url: p.url ?? "", dataDir: p.dataDir });
  const db = database.db;
  await db.execute(
    sql.raw(`create table fault_audit (task_id uuid, old_attempt int, attempt int,
      old_state text, new_state text, old_expires timestamptz,
      at timestamptz default clock_timestamp())`),
  );
  await db.execute(
    sql.raw(`create function fault_audit_fn() returns trigger language plpgsql as $$
      begin
        insert into fault_audit (task_id, old_attempt, attempt, old_state, new_state, old_expires)
          values (new.id, old.attempt, new.attempt, old.state, new.state, old.lease_expires_at);
        return new;
      end $$`),
  );
  await db.execute(
    sql.raw(`create trigger fault_audit_tr after update on tasks for each row
      when (old.state is distinct from new.state or old.attempt is distinct from new.attempt)
      execute function fault_audit_fn()`),
  );
  await database.close();
}

/** One recorded change of a task, times in epoch milliseconds. */
interface AuditRow {
  taskId: string;
  oldAttempt: number;
  attempt: number;
  oldState: string;
  newState: string;
  oldExpiresMs: number | null;
  atMs: number;
}

/** What the audit and the tasks table say, read after the coordinators stopped. */
async function audit(p: Place, taskIds: string[] = []) {
  const database = await openDatabase({ url: p.url ?? "", dataDir: p.dataDir });
  const one = async (q: string) =>
    Number((await rowsOf<{ n: unknown }>(database.db, sql.raw(q)))[0]?.n ?? -1);
  const result = {
    succeeded: await one(`select count(*)::int as n from tasks where state = 'SUCCEEDED'`),
    total: await one("select count(*)::int as n from tasks"),
    byState: (
      await rowsOf<{ state: string; n: number }>(
        database.db,
        sql.raw("select state, count(*)::int as n from tasks group by state order by state"),
      )
    )
      .map((r) => `${r.state} ${r.n}`)
      .join(", "),
    // Tasks that became SUCCEEDED exactly once (the audit sees every change to it).
    succeededOnce: await one(`select count(*)::int as n from (select task_id from fault_audit
      where new_state = 'SUCCEEDED' group by task_id having count(*) = 1) x`),
    changedAfterSuccess: await one(
      `select count(*)::int as n from fault_audit where old_state = 'SUCCEEDED'`,
    ),
    leasedTwice: await one(`select count(*)::int as n from (select task_id, attempt
      from fault_audit where attempt > old_attempt group by task_id, attempt
      having count(*) > 1) x`),
    rows: [] as AuditRow[],
  };
  if (taskIds.length > 0) {
    const ids = sql.join(
      taskIds.map((id) => sql`${id}::uuid`),
      sql`, `,
    );
    const q: SQL = sql`select task_id::text as "taskId", old_attempt as "oldAttempt",
      attempt, old_state as "oldState", new_state as "newState",
      (extract(epoch from old_expires) * 1000)::float8 as "oldExpiresMs",
      (extract(epoch from at) * 1000)::float8 as "atMs"
      from fault_audit where task_id in (${ids}) order by at`;
    result.rows = await rowsOf<AuditRow>(database.db, q);
  }
  await database.close();
  return result;
}

/**
 * When a lease held at `attempt` was given back: the first change after it
 * (the sweeper's return to PENDING, or a claim of the next attempt), with
 * the expiry of the lease it replaced, and when the next attempt was claimed.
 */
function requeueOf(rows: AuditRow[], taskId: string, attempt: number) {
  const mine = rows.filter((r) => r.taskId === taskId && r.oldAttempt === attempt);
  const back = mine.find((r) => r.newState === "PENDING" || r.attempt > attempt);
  const next = rows.find((r) => r.taskId === taskId && r.attempt === attempt + 1);
  return back ? { atMs: back.atMs, expiresMs: back.oldExpiresMs, claimedMs: next?.atMs } : null;
}

interface Coordinator {
  child: ChildProcess;
  url: string;
  exited: Promise<number | null>;
}

/**
 * The bearer token each coordinator (by URL) is called with: only those
 * started with auth on have one (their data dir's admin.token, or one made
 * on the database their first replica wrote it to).
 */
const tokenOf = new Map<string, string>();

async function startCoordinator(
  p: Place,
  port: number,
  dataDir = p.dataDir,
  options: { auth?: boolean; token?: string } = {},
): Promise<Coordinator> {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  if (p.url) env.DATABASE_URL = p.url;
  const child = spawnTracked(
    [
      "bin/meshwork.js",
      "serve",
      "--listen",
      `127.0.0.1:${port}`,
      "--auth",
      options.auth ? "on" : "off",
      "--data-dir",
      dataDir,
      "--log-level",
      "warn",
    ],
    { env, stdio: ["ignore", "ignore", "inherit"] },
  );
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 120_000;
  for (;;) {
    const status = await fetch(`${url}/readyz`).then(
      (r) => r.status,
      () => 0,
    );
    if (status === 200) {
      if (options.auth) {
        const file = join(dataDir, "admin.token");
        tokenOf.set(url, options.token ?? readFileSync(file, "utf8").trim());
      }
      return { child, url, exited };
    }
    if (child.exitCode !== null) throw new Error(`the coordinator exited with ${child.exitCode}`);
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error("the coordinator did not become ready");
    }
    await sleep(200);
  }
}

/** SIGTERM, then the exit code; SIGKILL if it has not exited within 30 s. */
async function stopCoordinator(c: Coordinator): Promise<number | null> {
  c.child.kill("SIGTERM");
  const timer = setTimeout(() => c.child.kill("SIGKILL"), 30_000);
  const code = await c.exited;
  clearTimeout(timer);
  return code;
}

/** A call that did not get an answer from the server (status 0) or got an HTTP error status. */
class RpcError extends Error {
  constructor(
    readonly method: string,
    readonly status: number,
    detail: string,
  ) {
    super(`${method}: ${status || detail}`);
  }
}

/** One Connect JSON call over HTTP/1.1 (fetch), as the drain's workers make it. */
async function rpc<T = Record<string, unknown>>(
  url: string,
  method: string,
  body: unknown,
  timeoutMs = 15_000,
): Promise<T> {
  let res: Response;
  try {
    const token = tokenOf.get(url);
    res = await fetch(`${url}/meshwork.v1.${method}`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        ...(token && { authorization: `Bearer ${token}` }),
      },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (error) {
    throw new RpcError(method, 0, String(error));
  }
  if (!res.ok) {
    await res.body?.cancel();
    throw new RpcError(method, res.status, "");
  }
  return (await res.json()) as T;
}

/** The call never reached a working server: a dead or restarting process, or database trouble (503). */
const unreachable = (e: unknown) => e instanceof RpcError && (e.status === 0 || e.status >= 500);

interface ClaimJson {
  taskId: string;
  attempt: number;
  leaseToken: string;
}

/**
 * Workers that claim (`maxTasks` at a time) and complete with CompleteTasks
 * until told to stop, riding out restarts and storms.
 */
function drain(target: () => string, workers: number, maxTasks = 10) {
  let stop = false;
  const state = { completed: 0 };
  const loops = Array.from({ length: workers }, async () => {
    let workerId = "";
    while (!stop) {
      try {
        if (!workerId) {
          workerId = (
            await rpc<{ workerId: string }>(target(), "FleetService/RegisterWorker", {
              capabilities: ["fault"],
              maxConcurrency: maxTasks * 2,
            })
          ).workerId;
        }
        const { claims = [] } = await rpc<{ claims?: ClaimJson[] }>(
          target(),
          "LeaseService/ClaimTasks",
          { workerId, maxTasks, waitSeconds: 1 },
        );
        if (claims.length === 0) continue;
        await rpc(target(), "LeaseService/CompleteTasks", {
          completions: claims.map((c) => ({
            taskId: c.taskId,
            workerId,
            attempt: c.attempt,
            leaseToken: c.leaseToken,
            resultSummary: "done",
          })),
        });
        state.completed += claims.length;
      } catch (error) {
        // A restart or a storm: try again. Anything else is a bug in this script.
        if (!unreachable(error) && !/timeout|aborted/i.test(String(error))) {
          console.log(`drain: ${error}`);
        }
        await sleep(200);
      }
    }
  });
  return Object.assign(state, {
    async stop() {
      stop = true;
      await Promise.all(loops);
    },
  });
}

async function createTasks(url: string, n: number, batch = 500): Promise<void> {
  for (let i = 0; i < n; i += batch) {
    const tasks = Array.from({ length: Math.min(batch, n - i) }, () => ({
      workload: "fault",
      leaseSeconds,
      maxAttempts: 100,
    }));
    await rpc(url, "TaskService/CreateTasks", { tasks });
  }
}

/** SUCCEEDED tasks as GetFleetStatus counts them; -1 while the coordinator does not answer. */
async function succeededNow(url: string): Promise<number> {
  try {
    const status = await rpc<{ taskCounts: { state: string; count?: string }[] }>(
      url,
      "FleetService/GetFleetStatus",
      {},
      5_000,
    );
    return Number(status.taskCounts.find((c) => c.state === "TASK_STATE_SUCCEEDED")?.count ?? 0);
  } catch {
    return -1;
  }
}

async function waitForSucceeded(url: () => string, n: number, ms: number): Promise<number> {
  const deadline = Date.now() + ms;
  let done = 0;
  while (Date.now() < deadline) {
    done = Math.max(done, await succeededNow(url()));
    if (done >= n) return done;
    await sleep(500);
  }
  return done;
}

/** 1. kill -9 of the coordinator, again and again, each time part-way through a drain. */
async function killDuringDrain(p: Place): Promise<void> {
  const engine = p.engine;
  const n = short ? 1000 : 5000;
  const kills = short ? 2 : 5;
  await installAudit(p);
  const port = await freePort();
  let c = await startCoordinator(p, port);
  await createTasks(c.url, n);
  const started = Date.now();
  const workers = drain(() => c.url, 8);
  const doneAtKill: number[] = [];
  for (let k = 0; k < kills; k++) {
    // Kill when the drain has done its share: k+1 of kills+1 parts, so every kill lands mid-drain.
    const due = Math.floor((n * (k + 1)) / (kills + 1));
    let done = 0;
    const deadline = Date.now() + 120_000;
    while (done < due && Date.now() < deadline) {
      done = await succeededNow(c.url);
      if (done < due) await sleep(100);
    }
    doneAtKill.push(done);
    c.child.kill("SIGKILL");
    await c.exited;
    c = await startCoordinator(p, port);
  }
  const done = await waitForSucceeded(() => c.url, n, short ? 120_000 : 300_000);
  const tookMs = Date.now() - started;
  await workers.stop();
  const code = await stopCoordinator(c);
  const a = await audit(p);
  const name = `${engine}: kill -9 ×${kills} during a drain of ${n} tasks`;
  check(
    `${name}: every kill landed mid-drain`,
    doneAtKill.every((d) => d >= 0 && d < n),
    `SUCCEEDED at each kill: ${doneAtKill.join(", ")}; drained in ${secs(tookMs)}`,
  );
  check(
    `${name}: every task SUCCEEDED exactly once`,
    done >= n && a.succeeded === n && a.succeededOnce === n,
    `${a.byState}; ${a.succeededOnce} became SUCCEEDED once`,
  );
  check(
    `${name}: no SUCCEEDED row changed`,
    a.changedAfterSuccess === 0,
    `${a.changedAfterSuccess}`,
  );
  check(`${name}: no (task, attempt) leased twice`, a.leasedTwice === 0, `${a.leasedTwice}`);
  check(`${name}: stops with exit 0 after`, code === 0, `exit ${code}`);
}

/**
 * 2. Three replicas on one PostgreSQL database, 64 claimers spread over
 * them (claim one, work 20 ms, complete it), kill -9 of one replica mid-drain. Its
 * claimers move to the survivors and drop what they held, as a worker whose
 * connection broke mid-call does: those leases must come back after they
 * expire, not before and not much later.
 */
async function replicas(p: Place): Promise<void> {
  const n = short ? 3000 : 10_000;
  const claimerCount = 64;
  const victim = 1;
  await installAudit(p);
  const coordinators = await Promise.all(
    [0, 1, 2].map(async (i) =>
      startCoordinator(p, await freePort(), i === 0 ? p.dataDir : p.newDataDir()),
    ),
  );
  const urls = coordinators.map((c) => c.url);
  await createTasks(urls[0] ?? "", n);
  const db = connect(p);
  let stop = false;
  let killed = false;
  const claimers = Array.from({ length: claimerCount }, (_, i) => ({
    workerId: "",
    home: i % urls.length,
    moves: 0,
    completedAfterKill: 0,
    refused: 0,
  }));
  const started = Date.now();
  const loops = claimers.map(async (c) => {
    while (!stop) {
      const url = urls[c.home] ?? "";
      try {
        if (!c.workerId) {
          c.workerId = (
            await rpc<{ workerId: string }>(url, "FleetService/RegisterWorker", {
              capabilities: ["fault"],
              maxConcurrency: 8,
            })
          ).workerId;
        }
        const { claims = [] } = await rpc<{ claims?: ClaimJson[] }>(
          url,
          "LeaseService/ClaimTasks",
          { workerId: c.workerId, maxTasks: 1, waitSeconds: 1 },
        );
        for (const claim of claims) {
          await sleep(20); // the work
          await rpc(url, "LeaseService/CompleteTask", {
            taskId: claim.taskId,
            workerId: c.workerId,
            attempt: claim.attempt,
            leaseToken: claim.leaseToken,
            resultSummary: "done",
          });
          if (killed) c.completedAfterKill++;
        }
      } catch (error) {
        if (stop) break;
        if (unreachable(error)) {
          // Connection refused or reset, or unavailable: on to the next replica, dropping
          // whatever this claimer held, after a second's back-off.
          c.home = (c.home + 1) % urls.length;
          c.moves++;
          await sleep(1000);
        } else {
          // A refusal from a live server (a lease that expired under a slow call): go on.
          c.refused++;
          await sleep(100);
        }
      }
    }
  });

  // Kill the victim when 40 % of the tasks are done.
  const succeeded = async () =>
    Number((await db`select count(*)::int as n from tasks where state = 'SUCCEEDED'`)[0]?.n);
  const deadline = Date.now() + 120_000;
  let doneAtKill = await succeeded();
  while (doneAtKill < n * 0.4 && Date.now() < deadline) {
    await sleep(100);
    doneAtKill = await succeeded();
  }
  const orphaned = claimers.filter((c) => c.home === victim).map((c) => c.workerId);
  const killAt = Date.now();
  coordinators[victim]?.child.kill("SIGKILL");
  killed = true;
  await coordinators[victim]?.exited;
  // The dead replica's connections are gone once PostgreSQL has read their end.
  await sleep(300);
  // Leases its claimers held at the kill (taken before it: a new lease would expire later).
  const held = await db<{ id: string; attempt: number; expiresMs: number }[]>`
    select id::text, attempt, (extract(epoch from lease_expires_at) * 1000)::float8 as "expiresMs"
    from tasks where state in ('ASSIGNED', 'RUNNING')
      and lease_worker_id::text = any(${orphaned}::text[])
      and lease_expires_at <= to_timestamp(${(killAt + leaseSeconds * 1000 + 500) / 1000})`;

  const drainDeadline = Date.now() + (short ? 90_000 : 180_000);
  let done = await succeeded();
  while (done < n && Date.now() < drainDeadline) {
    await sleep(250);
    done = await succeeded();
  }
  const tookMs = Date.now() - started;
  stop = true;
  await Promise.all(loops);
  await db.end();
  const survivorsUp = coordinators.every((c, i) => i === victim || c.child.exitCode === null);
  const codes = await Promise.all(
    coordinators.filter((_, i) => i !== victim).map((c) => stopCoordinator(c)),
  );
  const a = await audit(
    p,
    held.map((h) => h.id),
  );

  const name = `postgres: 3 replicas, ${claimerCount} claimers, kill -9 of one at ${doneAtKill}/${n} SUCCEEDED`;
  check(
    `${name}: the drain finished`,
    done >= n,
    `${done}/${n} in ${secs(tookMs)} (${Math.round((n * 1000) / tookMs)} tasks/s)`,
  );
  check(
    `${name}: every task SUCCEEDED exactly once`,
    a.succeeded === n && a.succeededOnce === n,
    `${a.byState}; ${a.succeededOnce} became SUCCEEDED once`,
  );
  check(`${name}: no (task, attempt) leased twice`, a.leasedTwice === 0, `${a.leasedTwice}`);
  check(
    `${name}: no SUCCEEDED row changed`,
    a.changedAfterSuccess === 0,
    `${a.changedAfterSuccess}`,
  );
  const moved = claimers.filter((c) => orphaned.includes(c.workerId));
  check(
    `${name}: the dead replica's ${moved.length} claimers moved to the survivors and completed tasks there`,
    moved.length > 0 && moved.every((c) => c.completedAfterKill > 0),
    `fewest completions after the kill ${Math.min(...moved.map((c) => c.completedAfterKill))}`,
  );
  const requeues = held.map((h) => ({ h, r: requeueOf(a.rows, h.id, h.attempt) }));
  const late = requeues.filter(
    ({ h, r }) => !r || r.atMs < h.expiresMs || r.atMs > h.expiresMs + 2000,
  );
  const afterExpiry = requeues.map(({ h, r }) => (r ? r.atMs - h.expiresMs : Number.NaN));
  const afterKill = requeues.map(({ r }) => (r ? r.atMs - killAt : Number.NaN));
  check(
    `${name}: the ${held.length} leases its claimers held were requeued after expiry, within 2 s of it`,
    held.length > 0 && late.length === 0,
    `${late.length} not; requeued ${secs(Math.min(...afterExpiry))}–${secs(Math.max(...afterExpiry))} after expiry, ` +
      `at most ${secs(Math.max(...afterKill))} after the kill (lease ${leaseSeconds} s)`,
  );
  check(
    `${name}: the survivors stayed up and stop with exit 0`,
    survivorsUp && codes.every((c) => c === 0),
    `exit ${codes.join(", ")}`,
  );
}

/**
 * 3. pg_terminate_backend of every coordinator connection every 150 ms
 * during a drain; after the storm a fresh CreateTask, claim and completion
 * must succeed within 10 s, and the drain finish.
 */
async function connectionStorm(p: Place): Promise<void> {
  const n = short ? 2000 : 10_000;
  const stormMs = short ? 5_000 : 20_000;
  await installAudit(p);
  const c = await startCoordinator(p, await freePort());
  await createTasks(c.url, n);
  const workers = drain(() => c.url, 8);
  const admin = connectPostgres(pgUrl ?? "", { max: 1, onnotice: () => {} });
  const name = new URL(p.url ?? "").pathname.slice(1);
  const ends = Date.now() + stormMs;
  let rounds = 0;
  let terminated = 0;
  while (Date.now() < ends && c.child.exitCode === null) {
    const r = await admin`select pg_terminate_backend(pid) from pg_stat_activity
      where datname = ${name} and pid <> pg_backend_pid()`;
    terminated += r.length;
    rounds++;
    await sleep(150);
  }
  await admin.end();
  const stormEnd = Date.now();
  const up = c.child.exitCode === null;
  const doneAtEnd = workers.completed;

  // Recovery: a new task created, claimed and completed, from scratch, within 10 s.
  let recoveredMs = Number.NaN;
  let probeWorker = "";
  const key = randomUUID();
  while (Number.isNaN(recoveredMs) && Date.now() - stormEnd < 10_000) {
    try {
      await rpc(
        c.url,
        "TaskService/CreateTask",
        { workload: "probe", leaseSeconds, idempotencyKey: key },
        3_000,
      );
      if (!probeWorker) {
        probeWorker = (
          await rpc<{ workerId: string }>(
            c.url,
            "FleetService/RegisterWorker",
            { capabilities: ["probe"] },
            3_000,
          )
        ).workerId;
      }
      const { claims = [] } = await rpc<{ claims?: ClaimJson[] }>(
        c.url,
        "LeaseService/ClaimTasks",
        { workerId: probeWorker, waitSeconds: 2 },
        5_000,
      );
      const claim = claims[0];
      if (claim) {
        await rpc(
          c.url,
          "LeaseService/CompleteTask",
          {
            taskId: claim.taskId,
            workerId: probeWorker,
            attempt: claim.attempt,
            leaseToken: claim.leaseToken,
          },
          3_000,
        );
        recoveredMs = Date.now() - stormEnd;
      }
    } catch {
      await sleep(100);
    }
  }
  const done = await waitForSucceeded(() => c.url, n + 1, 120_000);
  const drainedMs = Date.now() - stormEnd;
  await workers.stop();
  const code = await stopCoordinator(c);
  const a = await audit(p);
  const label = `postgres: connections terminated every 150 ms for ${stormMs / 1000} s (${rounds} rounds, ${terminated} backends)`;
  check(`${label}: the coordinator stayed up`, up);
  check(
    `${label}: the drain was still running when the storm ended`,
    doneAtEnd > 0 && doneAtEnd < n,
    `${doneAtEnd}/${n} completed by then`,
  );
  check(
    `${label}: CreateTask + ClaimTasks + CompleteTask succeeded within 10 s after`,
    recoveredMs <= 10_000,
    Number.isNaN(recoveredMs) ? "not within 10 s" : `after ${secs(recoveredMs)}`,
  );
  check(
    `${label}: every task SUCCEEDED exactly once`,
    done >= n + 1 && a.succeeded === n + 1 && a.succeededOnce === n + 1,
    `${a.byState} (${n} + the probe); drained ${secs(drainedMs)} after the storm`,
  );
  check(
    `${label}: no SUCCEEDED row changed`,
    a.changedAfterSuccess === 0,
    `${a.changedAfterSuccess}`,
  );
  check(`${label}: no (task, attempt) leased twice`, a.leasedTwice === 0, `${a.leasedTwice}`);
  check(`${label}: stops with exit 0 after`, code === 0, `exit ${code}`);
}

/**
 * A worker process: registers for its own workload, claims its task, prints
 * the claim, then renews the lease every second (a worker mid-task) until
 * it is killed.
 */
const workerScript = `
const base = process.env.FAULT_URL, workload = process.env.FAULT_WORKLOAD;
const call = async (m, b) => {
  const r = await fetch(base + "/meshwork.v1." + m, { method: "POST",
    headers: { "content-type": "application/json" }, body: JSON.stringify(b) });
  if (!r.ok) throw new Error(m + ": " + r.status);
  return r.json();
};
(async () => {
  const { workerId } = await call("FleetService/RegisterWorker", { capabilities: [workload] });
  let claims = [];
  while (claims.length === 0) ({ claims = [] } = await call("LeaseService/ClaimTasks", { workerId, waitSeconds: 5 }));
  const c = claims[0];
  console.log(JSON.stringify({ taskId: c.taskId, attempt: c.attempt }));
  for (;;) {
    await new Promise((r) => setTimeout(r, 1000));
    await call("LeaseService/RenewLease", { taskId: c.taskId, workerId, attempt: c.attempt, leaseToken: c.leaseToken });
    console.log("renewed");
  }
})().catch((e) => { console.error("worker: " + e); process.exit(1); });
`;

/**
 * 5. Worker processes killed (SIGKILL) mid-task while renewing their
 * leases: each task must be claimed again by a waiting worker within its
 * lease + 2 s of the kill, and not before the dead lease expired.
 */
async function deadWorkers(p: Place): Promise<void> {
  const engine = p.engine;
  const deaths = short ? 5 : 20;
  await installAudit(p);
  const c = await startCoordinator(p, await freePort());
  const workloads = Array.from({ length: deaths }, (_, i) => `dead-${i}`);
  await rpc(c.url, "TaskService/CreateTasks", {
    tasks: workloads.map((workload) => ({ workload, leaseSeconds, maxAttempts: 10 })),
  });
  const workers = workloads.map((workload) => {
    const child = spawnTracked(["-e", workerScript], {
      env: { ...process.env, FAULT_URL: c.url, FAULT_WORKLOAD: workload },
      stdio: ["ignore", "pipe", "inherit"],
    });
    const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
    const w = {
      child,
      claim: undefined as { taskId: string; attempt: number } | undefined,
      renewals: 0,
      killAt: 0,
    };
    lines.on("line", (line) => {
      if (line === "renewed") w.renewals++;
      else w.claim = JSON.parse(line);
    });
    return w;
  });
  // Every worker holds its task and has renewed it at least once: it is mid-task.
  const ready = Date.now() + 60_000;
  while (workers.some((w) => w.renewals < 1 && w.child.exitCode === null) && Date.now() < ready) {
    await sleep(100);
  }
  // Survivors wait for the tasks with long polls before the first kill.
  const survivors = workloads.map(async (workload) => {
    const { workerId } = await rpc<{ workerId: string }>(c.url, "FleetService/RegisterWorker", {
      capabilities: [workload],
    });
    const until = Date.now() + 30_000;
    while (Date.now() < until) {
      const { claims = [] } = await rpc<{ claims?: ClaimJson[] }>(
        c.url,
        "LeaseService/ClaimTasks",
        { workerId, waitSeconds: 10 },
        20_000,
      );
      const claim = claims[0];
      if (claim) {
        await rpc(c.url, "LeaseService/CompleteTask", {
          taskId: claim.taskId,
          workerId,
          attempt: claim.attempt,
          leaseToken: claim.leaseToken,
        });
        return true;
      }
    }
    return false;
  });
  await sleep(500);
  for (const w of workers) {
    await sleep(100 + Math.random() * 200);
    w.killAt = Date.now();
    w.child.kill("SIGKILL");
  }
  const completed = await Promise.all(survivors);
  const code = await stopCoordinator(c);
  const held = workers.filter((w) => w.claim);
  const a = await audit(
    p,
    held.map((w) => w.claim?.taskId ?? ""),
  );
  const measured = held.map((w) => {
    const r = requeueOf(a.rows, w.claim?.taskId ?? "", w.claim?.attempt ?? 0);
    return {
      expiresAfterKill: r?.expiresMs != null ? r.expiresMs - w.killAt : Number.NaN,
      requeuedAfterKill: r ? r.atMs - w.killAt : Number.NaN,
      claimedAfterKill: r?.claimedMs != null ? r.claimedMs - w.killAt : Number.NaN,
      early: r ? r.expiresMs == null || r.atMs < r.expiresMs : true,
    };
  });
  const max = (k: "expiresAfterKill" | "requeuedAfterKill" | "claimedAfterKill") =>
    Math.max(...measured.map((m) => m[k]));
  const bound = leaseSeconds * 1000 + 2000;
  const name = `${engine}: a worker process killed mid-task ×${deaths}`;
  check(
    `${name}: each held its task and renewed its lease before the kill`,
    held.length === deaths && workers.every((w) => w.renewals >= 1),
    `${held.length} held, fewest renewals ${Math.min(...workers.map((w) => w.renewals))}`,
  );
  check(
    `${name}: each task claimed again within the lease (${leaseSeconds} s) + 2 s of the kill`,
    measured.every((m) => m.claimedAfterKill <= bound) && completed.every(Boolean),
    `max ${secs(max("claimedAfterKill"))} to the next claim; claimable (requeued) at most ` +
      `${secs(max("requeuedAfterKill"))} after the kill; the dead lease ran out at most ${secs(max("expiresAfterKill"))} after it`,
  );
  check(
    `${name}: none taken back before its lease expired`,
    measured.every((m) => !m.early),
    `${measured.filter((m) => m.early).length} early`,
  );
  check(
    `${name}: every task SUCCEEDED exactly once`,
    a.succeeded === deaths && a.succeededOnce === deaths,
    a.byState,
  );
  check(`${name}: no (task, attempt) leased twice`, a.leasedTwice === 0, `${a.leasedTwice}`);
  check(`${name}: stops with exit 0 after`, code === 0, `exit ${code}`);
}

/** Resident memory of a process, from /proc (Linux). */
function rssOf(pid: number | undefined): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return Number(m?.[1] ?? 0) * 1024;
  } catch {
    return 0;
  }
}

const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / Math.max(1, xs.length);

/**
 * 6. A soak: peak throughput of create + claim + complete measured briefly,
 * then 70 % of it held for 10 minutes (45 s with --short), sampled: the
 * throughput of each interval, the coordinator's RSS, the tasks table's
 * dead tuples.
 */
async function soak(p: Place): Promise<void> {
  const calibrateMs = short ? 8_000 : 20_000;
  const soakMs = short ? 45_000 : 600_000;
  const sampleMs = short ? 5_000 : 20_000;
  const c = await startCoordinator(p, await freePort());
  const db = connect(p);
  const autovacuum = (await db`show autovacuum`)[0]?.autovacuum === "on";
  let created = 0;
  const workers = drain(() => c.url, 8);

  // Peak: producers keep a backlog of up to 4,000 tasks; count completions after a warm-up.
  let producing = true;
  const producers = Array.from({ length: 2 }, async () => {
    while (producing) {
      if (created - workers.completed > 4000) {
        await sleep(20);
        continue;
      }
      created += 500;
      await createTasks(c.url, 500).catch((e) => {
        created -= 500;
        console.log(`soak: ${e}`);
      });
    }
  });
  await sleep(2000);
  const from = workers.completed;
  const t0 = Date.now();
  await sleep(calibrateMs);
  const peak = ((workers.completed - from) * 1000) / (Date.now() - t0);
  producing = false;
  await Promise.all(producers);
  const calibrated = Date.now() + 60_000;
  while (workers.completed < created && Date.now() < calibrated) await sleep(100);
  const target = Math.round(peak * 0.7);
  console.log(
    `soak: peak ${Math.round(peak)} tasks/s (create + claim 10 + complete 10, 8 workers); ` +
      `holding ${target} tasks/s for ${soakMs / 1000} s, sampling every ${sampleMs / 1000} s`,
  );

  // The soak: one producer creates at the target rate, the workers drain it as it comes.
  const start = Date.now();
  const base = created;
  let soaking = true;
  const producer = (async () => {
    while (soaking) {
      const due = Math.floor((target * (Date.now() - start)) / 1000) - (created - base);
      // Every 200 ms what is due, so that a claim finds a batch rather than a task or two.
      if (due <= 0) {
        await sleep(200 - ((Date.now() - start) % 200));
        continue;
      }
      const k = Math.min(due, 1000);
      created += k;
      await createTasks(c.url, k, 1000).catch((e) => console.log(`soak: ${e}`));
    }
  })();

  // autovacuum is off on some servers (this repository's dev machines): then the suite does
  // what the daemon would, VACUUM when dead tuples pass its default threshold (50 + 20 % of
  // the live rows), and the check shows that the dead tuples can be removed, i.e. that no
  // coordinator transaction stays open holding them.
  let vacuums = 0;
  // With autovacuum's own cost limits (a manual VACUUM has none), so that it weighs no more.
  await db`set vacuum_cost_delay = '2ms'`;
  await db`set vacuum_cost_limit = 200`;
  let vacuuming: Promise<void> | undefined;
  const samples: { rate: number; rss: number; dead: number; live: number }[] = [];
  let lastCompleted = workers.completed;
  let lastAt = Date.now();
  while (Date.now() - start < soakMs) {
    await sleep(sampleMs - ((Date.now() - start) % sampleMs));
    const now = Date.now();
    const rate = ((workers.completed - lastCompleted) * 1000) / (now - lastAt);
    lastCompleted = workers.completed;
    lastAt = now;
    const stats = await db<{ dead: number; live: number }[]>`
      select n_dead_tup::float8 as dead, n_live_tup::float8 as live
      from pg_stat_user_tables where relname = 'tasks'`;
    const s = {
      rate,
      rss: rssOf(c.child.pid),
      dead: stats[0]?.dead ?? 0,
      live: stats[0]?.live ?? 0,
    };
    samples.push(s);
    console.log(
      `soak ${Math.round((now - start) / 1000)} s: ${Math.round(rate)} tasks/s completed, ` +
        `backlog ${created - workers.completed}, RSS ${mib(s.rss)}, tasks dead ${s.dead} / live ${s.live}`,
    );
    if (!autovacuum && !vacuuming && s.dead > 50 + 0.2 * s.live) {
      vacuums++;
      vacuuming = db`vacuum tasks`.then(
        () => {
          vacuuming = undefined;
        },
        (e) => console.log(`soak: vacuum: ${e}`),
      );
    }
  }
  soaking = false;
  await producer;
  await vacuuming;
  const drainEnd = Date.now() + 60_000;
  while (workers.completed < created && Date.now() < drainEnd) await sleep(100);
  await workers.stop();
  const states = await db<{ state: string; n: number }[]>`
    select state, count(*)::int as n from tasks group by state order by state`;
  await db.end();
  const up = c.child.exitCode === null;
  const code = await stopCoordinator(c);

  const label = `postgres: soak at 70 % of peak (${target} of ${Math.round(peak)} tasks/s) for ${soakMs / 1000} s`;
  // The first sample is the warm-up; the rest are split in thirds.
  const steady = samples.slice(1);
  const third = Math.max(1, Math.floor(steady.length / 3));
  const first = steady.slice(0, third);
  const last = steady.slice(-third);
  const minRate = Math.min(...steady.map((s) => s.rate));
  const held = `min ${Math.round(minRate)}, mean ${Math.round(mean(steady.map((s) => s.rate)))} tasks/s over ${steady.length} intervals`;
  if (short) {
    // A rate is a timing: on a shared CI machine anything else running moves
    // it, so the short suite reports it and checks the rest. The full suite
    // (npm run faults, run alone) holds it to the bound.
    console.log(`note ${label}: rate held (not checked in --short): ${held}`);
  } else {
    check(
      `${label}: every interval after the first ≥ 80 % of the target`,
      steady.length > 0 && minRate >= 0.8 * target,
      held,
    );
  }
  const rssFirst = mean(first.map((s) => s.rss));
  const rssLast = mean(last.map((s) => s.rss));
  const rssBound = Math.max(rssFirst * 1.25, rssFirst + 64 * 2 ** 20);
  check(
    `${label}: coordinator RSS flat (last third ≤ first third + 25 % or + 64 MiB)`,
    rssFirst > 0 && rssLast <= rssBound,
    `first third ${mib(rssFirst)}, last third ${mib(rssLast)}, max ${mib(Math.max(...steady.map((s) => s.rss)))}`,
  );
  // Unvacuumed, every task leaves two dead versions (claim, completion): dead ≈ 2 × live.
  // Kept up with, dead stays under 50 % of live plus what two intervals of updates leave.
  const allowance = 4 * target * (sampleMs / 1000);
  const judged = steady.slice(third);
  const worst = judged.reduce(
    (w, s) => (s.dead - 0.5 * s.live > w.dead - 0.5 * w.live ? s : w),
    judged[0] ?? { dead: 0, live: 0 },
  );
  const end = samples.at(-1) ?? { dead: 0, live: 0 };
  check(
    `${label}: tasks dead tuples bounded (≤ 50 % of live + ${allowance}) after the first third`,
    judged.length > 0 && judged.every((s) => s.dead <= 0.5 * s.live + allowance),
    `worst ${worst.dead} dead / ${worst.live} live, most dead ${Math.max(...judged.map((s) => s.dead))}; ` +
      `at the end ${end.dead} / ${end.live}; ` +
      (autovacuum
        ? "autovacuum on"
        : `autovacuum off on this server: ${vacuums} VACUUM by the suite`),
  );
  const total = states.reduce((s, r) => s + r.n, 0);
  const ok = states.find((r) => r.state === "SUCCEEDED")?.n ?? 0;
  check(
    `${label}: every task created SUCCEEDED`,
    total === created && ok === created,
    states.map((r) => `${r.state} ${r.n}`).join(", "),
  );
  check(`${label}: stayed up and stops with exit 0`, up && code === 0, `exit ${code}`);
}

/**
 * The PostgreSQL cluster this suite's database lives on, when this process
 * may restart it: the server is local (127.0.0.1 or localhost), Debian's
 * pg_ctlcluster is there and we are root. Undefined otherwise (the scenario
 * is skipped, saying why).
 */
function restartablePostgres(): { version: string; cluster: string } | undefined {
  if (!pgUrl || process.getuid?.() !== 0) return undefined;
  try {
    // Its host and port as the coordinator reads them: a Unix socket is local.
    const target = postgresTarget(pgUrl);
    const url = new URL(target.url);
    const local = target.path !== undefined || ["127.0.0.1", "localhost"].includes(url.hostname);
    if (!local) return undefined;
    const port = target.path?.split(".").pop() || url.port || "5432";
    const line = execFileSync("pg_lsclusters", ["-h"], { encoding: "utf8" })
      .split("\n")
      .map((l) => l.trim().split(/\s+/))
      .find((f) => f[2] === port);
    return line?.[0] && line[1] ? { version: line[0], cluster: line[1] } : undefined;
  } catch {
    return undefined;
  }
}

/**
 * 7. The whole PostgreSQL server restarted (pg_ctlcluster restart) during a
 * drain on 3 replicas with auth on, while a producer keeps creating tasks
 * and 16 workers claim and complete them in batches. Every create and every
 * completion the coordinators acknowledged is counted; afterwards every
 * acknowledged task exists, every acknowledged completion is SUCCEEDED, no
 * task SUCCEEDED twice, and the replicas rode it out (up, exit 0).
 */
async function postgresRestart(p: Place): Promise<void> {
  const server = restartablePostgres();
  if (!server) {
    console.log(
      "skip postgres restart: needs a local PostgreSQL, pg_ctlcluster and root (DATABASE_URL on 127.0.0.1)",
    );
    return;
  }
  const target = short ? 2000 : 6000;
  await installAudit(p);
  const first = await startCoordinator(p, await freePort(), p.dataDir, { auth: true });
  const token = tokenOf.get(first.url) ?? "";
  const coordinators = [
    first,
    ...(await Promise.all(
      [1, 2].map(async () =>
        startCoordinator(p, await freePort(), p.newDataDir(), { auth: true, token }),
      ),
    )),
  ];
  const urls = coordinators.map((c) => c.url);
  const created = new Set<string>();
  const completed = new Set<string>();
  let createErrors = 0;
  let stop = false;
  let producing = true;
  const producer = (async () => {
    let i = 0;
    while (producing && created.size < target) {
      const url = urls[i++ % urls.length] ?? "";
      try {
        const { tasks = [] } = await rpc<{ tasks?: { taskId: string }[] }>(
          url,
          "TaskService/CreateTasks",
          {
            tasks: Array.from({ length: 50 }, () => ({
              workload: "fault",
              leaseSeconds,
              maxAttempts: 100,
            })),
          },
        );
        for (const t of tasks) created.add(t.taskId);
      } catch {
        createErrors++;
        await sleep(200);
      }
    }
  })();
  let completeErrors = 0;
  const workers = Array.from({ length: 16 }, async (_, i) => {
    let workerId = "";
    while (!stop) {
      const url = urls[i % urls.length] ?? "";
      try {
        if (!workerId) {
          workerId = (
            await rpc<{ workerId: string }>(url, "FleetService/RegisterWorker", {
              capabilities: ["fault"],
              maxConcurrency: 20,
            })
          ).workerId;
        }
        const { claims = [] } = await rpc<{ claims?: ClaimJson[] }>(
          url,
          "LeaseService/ClaimTasks",
          { workerId, maxTasks: 10, waitSeconds: 1 },
        );
        if (claims.length === 0) continue;
        const { results = [] } = await rpc<{ results?: { task?: { taskId: string } }[] }>(
          url,
          "LeaseService/CompleteTasks",
          {
            completions: claims.map((c) => ({
              taskId: c.taskId,
              workerId,
              attempt: c.attempt,
              leaseToken: c.leaseToken,
              resultSummary: "done",
            })),
          },
        );
        for (const r of results) if (r.task) completed.add(r.task.taskId);
      } catch {
        completeErrors++;
        await sleep(300);
      }
    }
  });
  // Restart the whole server once a third of the target is done.
  const deadline = Date.now() + (short ? 120_000 : 240_000);
  while (completed.size < target / 3 && Date.now() < deadline) await sleep(100);
  const before = { created: created.size, completed: completed.size };
  const restartAt = Date.now();
  execFileSync(
    "pg_ctlcluster",
    ["--skip-systemctl-redirect", server.version, server.cluster, "restart"],
    {
      stdio: "ignore",
    },
  );
  const restartMs = Date.now() - restartAt;
  while ((producing && created.size < target) || [...created].some((id) => !completed.has(id))) {
    if (Date.now() > deadline) break;
    if (created.size >= target) producing = false;
    await sleep(250);
  }
  producing = false;
  stop = true;
  await producer;
  await Promise.all(workers);
  const up = coordinators.every((c) => c.child.exitCode === null);
  const codes = await Promise.all(coordinators.map((c) => stopCoordinator(c)));
  const db = connect(p);
  const ids = [...created];
  const [exist] = await db<
    { n: number }[]
  >`select count(*)::int as n from tasks where id::text = any(${ids}::text[])`;
  const [done] = await db<{ n: number }[]>`select count(*)::int as n from tasks
    where state = 'SUCCEEDED' and id::text = any(${[...completed]}::text[])`;
  await db.end();
  const a = await audit(p);
  const name = `postgres: whole server restarted (${secs(restartMs)}) during a drain on 3 replicas with auth on, at ${before.completed}/${before.created} completed`;
  check(
    `${name}: every acknowledged create is there`,
    exist?.n === created.size,
    `${exist?.n}/${created.size} acknowledged creates found; ${createErrors} creates refused or cut during the fault (retried)`,
  );
  check(
    `${name}: every acknowledged completion is SUCCEEDED, and every task completed`,
    done?.n === completed.size && completed.size === created.size,
    `${done?.n}/${completed.size} acknowledged completions SUCCEEDED, ${completed.size}/${created.size} tasks; ${completeErrors} claim or complete calls failed during the fault (retried)`,
  );
  check(
    `${name}: no task SUCCEEDED twice, no SUCCEEDED row changed, no (task, attempt) leased twice`,
    a.succeededOnce === a.succeeded && a.changedAfterSuccess === 0 && a.leasedTwice === 0,
    `${a.byState}; once ${a.succeededOnce}, changed ${a.changedAfterSuccess}, leased twice ${a.leasedTwice}`,
  );
  check(
    `${name}: the replicas stayed up and stop with exit 0`,
    up && codes.every((c) => c === 0),
    `exit ${codes.join(", ")}`,
  );
}

/** PostgreSQL when the suite has one, else PGlite: for scenarios of the coordinator's front door. */
const preferred: Engine = pgUrl ? "postgres" : "pglite";

/** The hostile scenarios' view of a place: its database (run.ts drops it after). */
function hostile(p: Place): HostileContext {
  return {
    check,
    short,
    pgUrl,
    place: async () => ({ url: p.url, drop: async () => {} }),
  };
}

interface Scenario {
  /** For --only. */
  key: string;
  engines: Engine[];
  run(p: Place): Promise<void>;
}

const scenarios: Scenario[] = [
  { key: "kill", engines: ["pglite", "postgres"], run: killDuringDrain },
  { key: "replicas", engines: ["postgres"], run: replicas },
  { key: "storm", engines: ["postgres"], run: connectionStorm },
  {
    key: "pool",
    engines: ["postgres"],
    // Its own coordinator on this place's database; the place is dropped here.
    run: (p) =>
      poolExhaustion({
        check,
        place: async () => ({ dataDir: p.dataDir, url: p.url, drop: async () => {} }),
        short,
      }),
  },
  { key: "dead-workers", engines: ["pglite", "postgres"], run: deadWorkers },
  { key: "soak", engines: ["postgres"], run: soak },
  { key: "pg-restart", engines: ["postgres"], run: postgresRestart },
  // Hostile and careless traffic (hostile.ts), with auth on.
  { key: "flood", engines: [preferred], run: (p) => flood(hostile(p)) },
  { key: "bad-tokens", engines: [preferred], run: (p) => badTokens(hostile(p)) },
  { key: "revoke", engines: ["pglite", "postgres"], run: (p) => revoke(hostile(p)) },
  { key: "burst", engines: ["postgres"], run: (p) => burst(hostile(p)) },
  { key: "disk-full", engines: ["pglite"], run: (p) => diskFull(hostile(p)) },
  { key: "corrupt", engines: ["pglite"], run: (p) => corrupt(hostile(p)) },
];

const started = Date.now();
try {
  for (const s of scenarios) {
    if (only && !only.includes(s.key)) continue;
    for (const engine of s.engines) {
      if (engine === "postgres" && !pgUrl) {
        console.log(`skip ${s.key} on PostgreSQL (set DATABASE_URL)`);
        continue;
      }
      const t = Date.now();
      const p = await place(engine);
      try {
        await s.run(p);
      } catch (error) {
        check(`${engine}: ${s.key}: ran to the end`, false, String(error));
      } finally {
        killAll();
        await p.drop();
      }
      console.log(`-- ${s.key} on ${engine}: ${secs(Date.now() - t)}`);
    }
  }
} finally {
  killAll();
  await dropAll();
}
console.log(`faults (${short ? "short" : "full"}, ${Math.round((Date.now() - started) / 1000)} s)`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
