/**
 * The fault suite (`npm run faults`, `npm run faults -- --short` in CI):
 * real coordinator processes on loopback, hurt the way production hurts
 * them, with the proof read from the database afterwards. Every scenario is
 * bounded in time. Runs on PGlite, and on PostgreSQL when DATABASE_URL is
 * set (the connection storm only there).
 *
 * Proof: before the coordinator first starts, a trigger is installed that
 * records every change of a task's state or attempt. Afterwards the checks
 * count tasks by state and read that record: no SUCCEEDED row ever changed
 * again, and no (task, attempt) was leased twice.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import postgres from "postgres";
import { openDatabase } from "../../src/db/database.js";
import { rowsOf } from "../../src/db/values.js";

const short = process.argv.includes("--short");
const pgUrl = process.env.DATABASE_URL || undefined;
let passed = 0;
let failed = 0;

function check(name: string, ok: boolean, detail = ""): void {
  if (ok) passed++;
  else failed++;
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? `: ${detail}` : ""}`);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

/** Where a scenario's coordinator keeps its data: a data dir, and a fresh PostgreSQL database or none. */
interface Place {
  dataDir: string;
  url: string | undefined;
  drop(): Promise<void>;
}

async function place(engine: "pglite" | "postgres"): Promise<Place> {
  const dataDir = mkdtempSync(join(tmpdir(), "meshwork-faults-"));
  if (engine === "pglite") return { dataDir, url: undefined, drop: async () => {} };
  const name = `meshwork_faults_${randomBytes(4).toString("hex")}`;
  const admin = postgres(pgUrl ?? "", { max: 1, onnotice: () => {} });
  await admin.unsafe(`create database ${name}`);
  const url = new URL(pgUrl ?? "");
  url.pathname = `/${name}`;
  return {
    dataDir,
    url: url.toString(),
    async drop() {
      await admin.unsafe(`drop database if exists ${name} with (force)`);
      await admin.end();
    },
  };
}

/** Migrates the database and installs the audit trigger, before any coordinator runs. */
async function installAudit(p: Place): Promise<void> {
  const database = await openDatabase({ url: p.url ?? "", dataDir: p.dataDir });
  const db = database.db;
  await db.execute(
    sql.raw(`create table fault_audit (task_id uuid, old_attempt int, attempt int,
      old_state text, new_state text, at timestamptz default clock_timestamp())`),
  );
  await db.execute(
    sql.raw(`create function fault_audit_fn() returns trigger language plpgsql as $$
      begin
        insert into fault_audit (task_id, old_attempt, attempt, old_state, new_state)
          values (new.id, old.attempt, new.attempt, old.state, new.state);
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

/** What the audit and the tasks table say, read after the coordinator stopped. */
async function audit(p: Place) {
  const database = await openDatabase({ url: p.url ?? "", dataDir: p.dataDir });
  const one = async (q: string) =>
    Number((await rowsOf<{ n: unknown }>(database.db, sql.raw(q)))[0]?.n ?? -1);
  const result = {
    succeeded: await one(`select count(*)::int as n from tasks where state = 'SUCCEEDED'`),
    total: await one("select count(*)::int as n from tasks"),
    changedAfterSuccess: await one(
      `select count(*)::int as n from fault_audit where old_state = 'SUCCEEDED'`,
    ),
    leasedTwice: await one(`select count(*)::int as n from (select task_id, attempt
      from fault_audit where attempt > old_attempt group by task_id, attempt
      having count(*) > 1) x`),
  };
  await database.close();
  return result;
}

interface Coordinator {
  child: ChildProcess;
  url: string;
  exited: Promise<number | null>;
}

async function startCoordinator(p: Place, port: number): Promise<Coordinator> {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  if (p.url) env.DATABASE_URL = p.url;
  const child = spawn(
    "node",
    ["bin/meshwork.js", "serve", "--listen", `127.0.0.1:${port}`, "--auth", "off"].concat([
      "--data-dir",
      p.dataDir,
      "--log-level",
      "warn",
    ]),
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
    if (status === 200) return { child, url, exited };
    if (child.exitCode !== null) throw new Error(`the coordinator exited with ${child.exitCode}`);
    if (Date.now() > deadline) throw new Error("the coordinator did not become ready");
    await sleep(200);
  }
}

async function rpc<T = Record<string, unknown>>(url: string, method: string, body: unknown) {
  const res = await fetch(`${url}/meshwork.v1.${method}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(15_000),
  });
  if (!res.ok) throw new Error(`${method}: ${res.status}`);
  return (await res.json()) as T;
}

/** Workers that claim and complete until told to stop, riding out restarts. */
function drain(target: () => string, workers: number) {
  let stop = false;
  const loops = Array.from({ length: workers }, async () => {
    let workerId = "";
    while (!stop) {
      try {
        if (!workerId) {
          workerId = (
            await rpc<{ workerId: string }>(target(), "FleetService/RegisterWorker", {
              capabilities: ["fault"],
              maxConcurrency: 20,
            })
          ).workerId;
        }
        const { claims = [] } = await rpc<{
          claims?: { taskId: string; attempt: number; leaseToken: string }[];
        }>(target(), "LeaseService/ClaimTasks", { workerId, maxTasks: 10, waitSeconds: 1 });
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
      } catch (error) {
        // A restart or a storm: try again. Anything else is a bug in this script.
        const m = String(error);
        if (!/fetch failed|: 5\d\d|aborted|timeout/i.test(m)) console.log(`drain: ${m}`);
        await sleep(200);
      }
    }
  });
  return async () => {
    stop = true;
    await Promise.all(loops);
  };
}

async function createTasks(url: string, n: number): Promise<void> {
  for (let i = 0; i < n; i += 500) {
    const tasks = Array.from({ length: Math.min(500, n - i) }, () => ({
      workload: "fault",
      leaseSeconds: 5,
      maxAttempts: 100,
    }));
    await rpc(url, "TaskService/CreateTasks", { tasks });
  }
}

async function waitForSucceeded(url: () => string, n: number, ms: number): Promise<number> {
  const deadline = Date.now() + ms;
  let done = 0;
  while (Date.now() < deadline) {
    try {
      const status = await rpc<{ taskCounts: { state: string; count?: string }[] }>(
        url(),
        "FleetService/GetFleetStatus",
        {},
      );
      done = Number(status.taskCounts.find((c) => c.state === "TASK_STATE_SUCCEEDED")?.count ?? 0);
      if (done >= n) return done;
    } catch {
      // restarting
    }
    await sleep(500);
  }
  return done;
}

/** kill -9 of the coordinator, again and again, during a drain. */
async function killDuringDrain(engine: "pglite" | "postgres"): Promise<void> {
  const n = short ? 1000 : 5000;
  const kills = short ? 2 : 5;
  const p = await place(engine);
  await installAudit(p);
  const port = await freePort();
  let c = await startCoordinator(p, port);
  await createTasks(c.url, n);
  const stopDrain = drain(() => c.url, 8);
  for (let k = 0; k < kills; k++) {
    await sleep(1000 + Math.random() * 2000);
    c.child.kill("SIGKILL");
    await c.exited;
    c = await startCoordinator(p, port);
  }
  const done = await waitForSucceeded(() => c.url, n, short ? 120_000 : 300_000);
  await stopDrain();
  c.child.kill("SIGTERM");
  const code = await c.exited;
  const a = await audit(p);
  const name = `${engine}: kill -9 ×${kills} during a drain of ${n} tasks`;
  check(`${name}: every task SUCCEEDED`, done >= n && a.succeeded === n, `${a.succeeded}/${n}`);
  check(
    `${name}: no SUCCEEDED row changed`,
    a.changedAfterSuccess === 0,
    `${a.changedAfterSuccess}`,
  );
  check(`${name}: no (task, attempt) leased twice`, a.leasedTwice === 0, `${a.leasedTwice}`);
  check(`${name}: stops with exit 0 after`, code === 0, `exit ${code}`);
  await p.drop();
}

/** pg_terminate_backend of every coordinator connection every 150 ms during a drain. */
async function connectionStorm(): Promise<void> {
  const n = short ? 1000 : 5000;
  const stormMs = short ? 5_000 : 20_000;
  const p = await place("postgres");
  await installAudit(p);
  const c = await startCoordinator(p, await freePort());
  await createTasks(c.url, n);
  const stopDrain = drain(() => c.url, 8);
  const admin = postgres(pgUrl ?? "", { max: 1, onnotice: () => {} });
  const name = new URL(p.url ?? "").pathname.slice(1);
  const ends = Date.now() + stormMs;
  let rounds = 0;
  while (Date.now() < ends && c.child.exitCode === null) {
    await admin`select pg_terminate_backend(pid) from pg_stat_activity
      where datname = ${name} and pid <> pg_backend_pid()`;
    rounds++;
    await sleep(150);
  }
  await admin.end();
  const up = c.child.exitCode === null;
  const recoveredBy = Date.now() + 10_000;
  let ready = false;
  while (!ready && Date.now() < recoveredBy) {
    ready =
      (await fetch(`${c.url}/readyz`).then(
        (r) => r.status,
        () => 0,
      )) === 200;
    if (!ready) await sleep(200);
  }
  const done = await waitForSucceeded(() => c.url, n, 120_000);
  await stopDrain();
  c.child.kill("SIGTERM");
  await c.exited;
  const a = await audit(p);
  const label = `postgres: connections terminated every 150 ms for ${stormMs / 1000} s (${rounds} rounds)`;
  check(`${label}: the coordinator stayed up`, up);
  check(`${label}: ready again within 10 s`, ready);
  check(`${label}: every task SUCCEEDED`, done >= n && a.succeeded === n, `${a.succeeded}/${n}`);
  check(`${label}: no SUCCEEDED row changed`, a.changedAfterSuccess === 0);
  check(`${label}: no (task, attempt) leased twice`, a.leasedTwice === 0);
  await p.drop();
}

/** Workers that die holding a lease: each task is claimable again within its lease + 2 s. */
async function deadWorkers(engine: "pglite" | "postgres"): Promise<void> {
  const deaths = short ? 5 : 20;
  const p = await place(engine);
  const c = await startCoordinator(p, await freePort());
  let late = 0;
  for (let i = 0; i < deaths; i++) {
    const workload = `dead-${i}`;
    const reg = () =>
      rpc<{ workerId: string }>(c.url, "FleetService/RegisterWorker", { capabilities: [workload] });
    const dead = (await reg()).workerId;
    await rpc(c.url, "TaskService/CreateTask", { workload, leaseSeconds: 5 });
    await rpc(c.url, "LeaseService/ClaimTasks", { workerId: dead });
    const claimedAt = Date.now();
    // The dead worker never renews. Another one long-polls for the task.
    const alive = (await reg()).workerId;
    const { claims = [] } = await rpc<{ claims?: unknown[] }>(c.url, "LeaseService/ClaimTasks", {
      workerId: alive,
      waitSeconds: 10,
    });
    if (claims.length === 0 || Date.now() - claimedAt > 7_000) late++;
  }
  c.child.kill("SIGTERM");
  await c.exited;
  check(
    `${engine}: a worker killed mid-task ×${deaths}: requeued within the lease (5 s) + 2 s`,
    late === 0,
    `${late} late`,
  );
  await p.drop();
}

const started = Date.now();
for (const engine of pgUrl ? (["pglite", "postgres"] as const) : (["pglite"] as const)) {
  await killDuringDrain(engine);
  await deadWorkers(engine);
}
if (pgUrl) await connectionStorm();
else console.log("skip connection storm (PostgreSQL only: set DATABASE_URL)");
console.log(`faults (${short ? "short" : "full"}, ${Math.round((Date.now() - started) / 1000)} s)`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
