/**
 * Fault scenario: the PostgreSQL pool exhausted. Every connection of a
 * real coordinator's request pool (the default 10) that ordinary work may
 * take (all but the 2 of the urgent lane, db/pool-gate.ts) is held by a
 * statement blocked on a row lock another session holds, for several
 * seconds. While it lasts, claims and heartbeats must fail fast with
 * `unavailable` (503, `retry-after`), never hang until the client's
 * deadline; a worker's lease renewals and its completion, on the urgent
 * lane, must still be answered; and the sweeper, on its own connection,
 * must keep returning expired leases to PENDING. After the lock goes, the
 * blocked calls complete and the tasks drain.
 *
 * PostgreSQL only (PGlite has no pool). Called from run.ts with its helpers.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createServer } from "node:net";
import { connectPostgres } from "../../src/db/postgres-client.js";

/** What run.ts passes in: its `check`, a fresh PostgreSQL place, and --short. */
export interface PoolExhaustionContext {
  check(name: string, ok: boolean, detail?: string): void;
  place(): Promise<{ dataDir: string; url: string | undefined; drop(): Promise<void> }>;
  short: boolean;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The shipped defaults (--db-pool-size, --db-acquire-timeout): the scenario runs as deployed. */
const poolSize = 10;
/** What ordinary work may hold: the pool less the urgent lane's reserve (db/database.ts). */
const ordinarySlots = poolSize - Math.min(2, Math.floor(poolSize / 4));
const acquireTimeoutMs = 3000;
/** Far above the acquire timeout: a call that queues instead of failing fast ends as 504. */
const clientDeadlineMs = 15_000;

export async function poolExhaustion(ctx: PoolExhaustionContext): Promise<void> {
  const holdMs = ctx.short ? 8_000 : 15_000;
  const n = 50;
  const p = await ctx.place();
  const url = p.url ?? "";
  const coordinator = await start(p.dataDir, url);
  const base = coordinator.url;
  const admin = connectPostgres(url, { max: 2, onnotice: () => {} });
  const label = `postgres: pool of ${poolSize} exhausted for ${holdMs / 1000} s`;
  try {
    const reg = async (name: string) =>
      (await call(base, "FleetService/RegisterWorker", {
        name,
        capabilities: ["pool"],
        maxConcurrency: 100,
      })) as { workerId: string };
    const blocked = (await reg("blocked")).workerId;
    const victim = (await reg("victim")).workerId;
    await call(base, "TaskService/CreateTasks", {
      tasks: Array.from({ length: n }, () => ({ workload: "pool", leaseSeconds: 5 })),
    });
    // The victim takes 10 leases and never renews them: they expire during
    // the exhaustion, and only the sweeper can give them back.
    const claimed = (await call(base, "LeaseService/ClaimTasks", {
      workerId: victim,
      maxTasks: 10,
    })) as { claims?: { taskId: string }[] };
    const held = (claimed.claims ?? []).map((c) => c.taskId);
    // The keeper holds one lease and renews it through the exhaustion.
    const keeper = (await reg("keeper")).workerId;
    const kept = (
      (await call(base, "LeaseService/ClaimTasks", { workerId: keeper, maxTasks: 1 })) as {
        claims: { taskId: string; attempt: number; leaseToken: string }[];
      }
    ).claims[0];
    if (!kept) throw new Error("the keeper claimed nothing");
    const keptLease = {
      taskId: kept.taskId,
      attempt: kept.attempt,
      leaseToken: kept.leaseToken,
      workerId: keeper,
    };

    // Another session locks the blocked worker's row; one Heartbeat per
    // connection ordinary work may take waits on it.
    const holder = await admin.reserve();
    await holder`begin`;
    await holder`select 1 from workers where id = ${blocked} for update`;
    const stuck = Promise.all(
      Array.from({ length: ordinarySlots }, () =>
        rpc(base, "FleetService/Heartbeat", { workerId: blocked }),
      ),
    );
    const lockedAt = Date.now();
    let waiting = 0;
    while (Date.now() - lockedAt < 10_000) {
      const [row] = await admin`select count(*)::int as n from pg_stat_activity
        where application_name = 'meshwork' and wait_event_type = 'Lock'`;
      waiting = row?.n ?? 0;
      if (waiting >= ordinarySlots) break;
      await sleep(50);
    }

    // Claims and heartbeats of another worker while every connection is busy.
    const answers: { status: number; code: string; retryAfter: string | null; ms: number }[] = [];
    const renewals: { status: number; code: string }[] = [];
    let readyz = 0;
    while (Date.now() - lockedAt < holdMs) {
      const [claim, heartbeat, ready, renewal] = await Promise.all([
        rpc(base, "LeaseService/ClaimTasks", { workerId: victim, maxTasks: 1 }),
        rpc(base, "FleetService/Heartbeat", { workerId: victim }),
        fetch(`${base}/readyz`).then(
          (r) => r.status,
          () => 0,
        ),
        rpc(base, "LeaseService/RenewLease", keptLease),
      ]);
      answers.push(claim, heartbeat);
      renewals.push(renewal);
      readyz = ready;
    }
    const completion = await rpc(base, "LeaseService/CompleteTask", keptLease);
    const [states] = await admin`select count(*)::int as n from tasks
      where id = any(${held}::uuid[]) and state = 'PENDING'`;
    const requeued = states?.n ?? 0;
    await holder`rollback`;
    holder.release();
    const released = await stuck;

    const refused = answers.filter((a) => a.status === 503 && a.code === "unavailable");
    const slowest = Math.max(...answers.map((a) => a.ms));
    ctx.check(
      `${label}: every pool connection ordinary work may take was held (${ordinarySlots})`,
      waiting >= ordinarySlots,
      `${waiting}`,
    );
    ctx.check(
      `${label}: claims and heartbeats answered unavailable (503)`,
      answers.length > 0 && refused.length === answers.length,
      `${refused.length}/${answers.length}${refused.length < answers.length ? `; e.g. ${JSON.stringify(answers.find((a) => a.code !== "unavailable"))}` : ""}`,
    );
    ctx.check(
      `${label}: with retry-after`,
      refused.every((a) => a.retryAfter === "1"),
    );
    ctx.check(
      `${label}: each within the acquire timeout (${acquireTimeoutMs} ms) + 1 s, not the client deadline`,
      slowest < acquireTimeoutMs + 1000,
      `slowest ${slowest} ms`,
    );
    ctx.check(`${label}: /readyz 503 while exhausted`, readyz === 503, `${readyz}`);
    ctx.check(
      `${label}: a held lease was renewed and completed meanwhile (the urgent lane)`,
      renewals.length > 0 && renewals.every((r) => r.status === 200) && completion.status === 200,
      `renewals ${renewals.filter((r) => r.status === 200).length}/${renewals.length}; completion ${completion.status} ${completion.code}`,
    );
    ctx.check(
      `${label}: the sweeper returned the ${held.length} expired leases to PENDING meanwhile`,
      held.length === 10 && requeued === held.length,
      `${requeued}/${held.length}`,
    );
    ctx.check(
      `${label}: the blocked calls completed after the lock went`,
      released.every((a) => a.status === 200),
      released.map((a) => a.status).join(","),
    );
    // Everything works again: the victim drains all tasks, the requeued ones included.
    const drainedBy = Date.now() + 30_000;
    let done = 0;
    while (done < n - 1 && Date.now() < drainedBy) {
      const { claims = [] } = (await call(base, "LeaseService/ClaimTasks", {
        workerId: victim,
        maxTasks: 20,
      })) as { claims?: { taskId: string; attempt: number; leaseToken: string }[] };
      if (claims.length === 0) {
        await sleep(100);
        continue;
      }
      await call(base, "LeaseService/CompleteTasks", {
        completions: claims.map((c) => ({
          taskId: c.taskId,
          attempt: c.attempt,
          leaseToken: c.leaseToken,
          workerId: victim,
        })),
      });
      done += claims.length;
    }
    const [ok] = await admin`select count(*)::int as n from tasks where state = 'SUCCEEDED'`;
    // The victim drained every task but the keeper's, which it completed itself.
    ctx.check(`${label}: every task SUCCEEDED after`, ok?.n === n, `${ok?.n}/${n}`);
  } catch (error) {
    ctx.check(`${label}: ran to the end`, false, String(error));
  } finally {
    await admin.end();
    coordinator.child.kill("SIGTERM");
    const code = await coordinator.exited;
    ctx.check(`${label}: stops with exit 0 after`, code === 0, `exit ${code}`);
    await p.drop();
  }
}

/** One Connect JSON call with a deadline far above the acquire timeout; never throws. */
async function rpc(base: string, method: string, body: unknown) {
  const started = Date.now();
  try {
    const res = await fetch(`${base}/meshwork.v1.${method}`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "connect-timeout-ms": String(clientDeadlineMs),
      },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(clientDeadlineMs + 5000),
    });
    const json = (await res.json().catch(() => ({}))) as { code?: string };
    return {
      status: res.status,
      code: json.code ?? "",
      retryAfter: res.headers.get("retry-after"),
      ms: Date.now() - started,
    };
  } catch (error) {
    return { status: 0, code: String(error), retryAfter: null, ms: Date.now() - started };
  }
}

async function call(base: string, method: string, body: unknown): Promise<unknown> {
  const res = await fetch(`${base}/meshwork.v1.${method}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(15_000),
  });
  if (!res.ok) throw new Error(`${method}: ${res.status} ${await res.text()}`);
  return res.json();
}

async function start(dataDir: string, url: string) {
  const port = await new Promise<number>((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
  const child: ChildProcess = spawn(
    "node",
    [
      "bin/meshwork.js",
      "serve",
      "--listen",
      `127.0.0.1:${port}`,
      "--auth",
      "off",
      "--data-dir",
      dataDir,
      "--log-level",
      "error",
      "--db-pool-size",
      String(poolSize),
      "--db-acquire-timeout",
      String(acquireTimeoutMs),
    ],
    { env: { ...process.env, DATABASE_URL: url }, stdio: ["ignore", "ignore", "inherit"] },
  );
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 120_000;
  for (;;) {
    const status = await fetch(`${base}/readyz`).then(
      (r) => r.status,
      () => 0,
    );
    if (status === 200) return { child, url: base, exited };
    if (child.exitCode !== null) throw new Error(`the coordinator exited with ${child.exitCode}`);
    if (Date.now() > deadline) throw new Error("the coordinator did not become ready");
    await sleep(200);
  }
}
