/**
 * The claim after bloat (bench:compare part `bloat`), on PostgreSQL:
 *
 * - through: on a fresh coordinator, a probe (one worker's serial claims
 *   of 32 + CompleteTasks, BENCH_BLOAT_CLAIMS of them: claim p50/p99; then
 *   a 1b drain of BENCH_BACKLOG_DRAIN tasks); then BENCH_BLOAT (1,000,000)
 *   tasks "go through" in SQL (inserted PENDING, leased to the probe's
 *   worker, then SUCCEEDED: the two dead versions of each task and their
 *   index entries a claim and a completion leave); then the same probe,
 *   after the coordinator's own upkeep vacuumed the table (it is waited
 *   for, at most 5 minutes), or at once with `--vacuum off`. Both are run:
 *   with the coordinator's vacuum and without it.
 * - pinned: one session holds a repeatable-read transaction open (its
 *   snapshot pins the xmin horizon: nothing can be vacuumed) while
 *   BENCH_WORKERS workers drain 1b for BENCH_PIN_SECONDS (600); the claims'
 *   p50 of the first and of the last tenth of that time, and the drain's
 *   tasks/s in each.
 *
 * Autovacuum is as the server has it (`show autovacuum` is printed); the
 * benchmark machine has it off.
 */
import { connectPostgres } from "../src/db/postgres-client.js";
import {
  type Coordinator,
  clients,
  completionsOf,
  drain,
  enqueue,
  grpc,
  print,
  quantile,
  round2,
  startCoordinator,
  taskIdAt,
} from "./lib.js";

const env = process.env;
const through = Number(env.BENCH_BLOAT ?? 1_000_000);
const probeClaims = Number(env.BENCH_BLOAT_CLAIMS ?? 200);
const probeDrain = Number(env.BENCH_BACKLOG_DRAIN ?? 10_000);
const pinSeconds = Number(env.BENCH_PIN_SECONDS ?? 600);
const workers = Number(env.BENCH_WORKERS ?? 16);
const batch = Number(env.BENCH_BATCH ?? 32);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** One worker's serial claims of 32 + CompleteTasks (p50/p99 of the claims), then a 1b drain. */
async function probe(co: Coordinator, workerId: string, workload: string) {
  const c = clients(grpc(co));
  await enqueue(c, workload, probeClaims * 32);
  const ms: number[] = [];
  for (let i = 0; i < probeClaims; i++) {
    const t0 = performance.now();
    const { claims } = await c.leases.claimTasks({ workerId, maxTasks: 32 });
    ms.push(performance.now() - t0);
    await c.leases.completeTasks({
      completions: completionsOf(claims, workerId),
    });
  }
  ms.sort((a, b) => a - b);
  const d = await drain(co, { batch, tasks: probeDrain, workers });
  return { p50: quantile(ms, 0.5), p99: quantile(ms, 0.99), drain: d.tasksPerS };
}

/** Fresh, then after `through` tasks went through; `vacuum` as the coordinator's --vacuum. */
export async function bloatThrough(vacuum: "on" | "off") {
  const co = await startCoordinator("postgres", { logsToStderr: true, args: ["--vacuum", vacuum] });
  const sql = connectPostgres(co.databaseUrl, { max: 1, onnotice: () => {} });
  try {
    const [av] = await sql`show autovacuum`;
    const c = clients(grpc(co));
    const workload = `probe-${Date.now()}`;
    const { workerId } = await c.fleet.registerWorker({
      capabilities: [workload],
      maxConcurrency: 32,
    });
    await probe(co, workerId, workload); // warm-up
    const fresh = await probe(co, workerId, workload);
    const [before] = await sql`select vacuum_count::int as n from pg_stat_user_tables
      where relname = 'tasks'`;
    const started = performance.now();
    const old = `through-${Date.now()}`;
    await sql`
      insert into tasks (id, workload, state, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier, created_at, updated_at)
      select ${taskIdAt(sql, sql`s.at`)}, ${old}, 'PENDING', 3, 60, 1000, 300000, 2, s.at, now()
      from generate_series(1, ${through}::int) g,
        lateral (select now() - (${through}::int - g) * interval '1 millisecond' as at) s`;
    await sql`update tasks set state = 'ASSIGNED', attempt = 1, lease_worker_id = ${workerId},
      lease_token = 'through', lease_expires_at = now() + interval '1 hour', started_at = now()
      where workload = ${old}`;
    await sql`update tasks set state = 'SUCCEEDED', finished_at = now(), lease_expires_at = null
      where workload = ${old}`;
    await sql`checkpoint`;
    const throughSeconds = (performance.now() - started) / 1000;
    // With --vacuum on, the coordinator's upkeep (every 10 s) vacuums it.
    let waited = 0;
    if (vacuum === "on") {
      const w0 = performance.now();
      for (let i = 0; i < 300; i++) {
        const [row] = await sql`select n_dead_tup::int as dead, vacuum_count::int as n
          from pg_stat_user_tables where relname = 'tasks'`;
        if ((row?.n ?? 0) > (before?.n ?? 0) && (row?.dead ?? 0) < through / 10) break;
        await sleep(1000);
      }
      waited = (performance.now() - w0) / 1000;
    }
    const after = await probe(co, workerId, workload);
    const [dead] = await sql`select n_dead_tup::int as dead from pg_stat_user_tables
      where relname = 'tasks'`;
    print({
      scenario: "bloat-through",
      database: "postgres",
      autovacuum: String(av?.autovacuum),
      coordinator_vacuum: vacuum,
      tasks_through: through,
      through_seconds: round2(throughSeconds),
      waited_for_vacuum_seconds: round2(waited),
      dead_rows_after: dead?.dead,
      fresh: {
        claim32_p50_ms: fresh.p50,
        claim32_p99_ms: fresh.p99,
        drain_1b: Math.round(fresh.drain),
      },
      after: {
        claim32_p50_ms: after.p50,
        claim32_p99_ms: after.p99,
        drain_1b: Math.round(after.drain),
      },
    });
    return { fresh, after };
  } finally {
    await sql.end();
    await co.stop();
  }
}

/** 1b drains for pinSeconds while a transaction holds the horizon: first and last tenth. */
export async function bloatPinned() {
  const co = await startCoordinator("postgres", { logsToStderr: true });
  const holder = connectPostgres(co.databaseUrl, {
    max: 1,
    onnotice: () => {},
    connection: { application_name: "bench-pin" },
  });
  try {
    const c = clients(grpc(co));
    await drain(co, { batch, tasks: 2000, workers }); // warm-up
    const reserved = await holder.reserve();
    await reserved`begin isolation level repeatable read`;
    await reserved`select count(*) from tasks`;
    const workload = `pinned-${Date.now()}`;
    // 16 workers, each on its own connection for the whole run, claim 32
    // and complete them until the time is up; a feeder keeps 20,000 tasks
    // ahead of them. Each claim's time and end are kept, by tenth of the run.
    const tenths = Array.from({ length: 10 }, () => ({ claimMs: [] as number[], done: 0 }));
    await enqueue(c, workload, 20_000);
    const started = performance.now();
    const elapsed = () => (performance.now() - started) / 1000;
    const tenthOf = () => Math.min(9, Math.floor((elapsed() / pinSeconds) * 10));
    let created = 20_000;
    let completed = 0;
    const feeder = (async () => {
      while (elapsed() < pinSeconds) {
        if (created - completed < 20_000) {
          await enqueue(c, workload, 5000);
          created += 5000;
        } else await sleep(50);
      }
    })();
    await Promise.all(
      Array.from({ length: workers }, async () => {
        const w = clients(grpc(co));
        const { workerId } = await w.fleet.registerWorker({
          capabilities: [workload],
          maxConcurrency: batch,
        });
        while (elapsed() < pinSeconds) {
          const t0 = performance.now();
          const { claims } = await w.leases.claimTasks({ workerId, maxTasks: batch });
          if (claims.length === 0) {
            await sleep(5);
            continue;
          }
          const slot = tenths[tenthOf()];
          slot?.claimMs.push(performance.now() - t0);
          await w.leases.completeTasks({
            completions: completionsOf(claims, workerId),
          });
          completed += claims.length;
          const end = tenths[tenthOf()];
          if (end) end.done += claims.length;
        }
      }),
    );
    await feeder;
    await reserved`rollback`;
    reserved.release();
    const p50 = (xs: number[]) =>
      quantile(
        [...xs].sort((a, b) => a - b),
        0.5,
      );
    const perS = (done: number) => Math.round(done / (pinSeconds / 10));
    const [first, last] = [tenths[0], tenths[9]];
    const r = {
      firstP50: p50(first?.claimMs ?? []),
      lastP50: p50(last?.claimMs ?? []),
      firstRate: perS(first?.done ?? 0),
      lastRate: perS(last?.done ?? 0),
    };
    print({
      scenario: "bloat-pinned-horizon",
      database: "postgres",
      seconds: pinSeconds,
      tasks_drained: completed,
      first_tenth: { claim32_p50_ms: r.firstP50, drain_1b: r.firstRate },
      last_tenth: { claim32_p50_ms: r.lastP50, drain_1b: r.lastRate },
    });
    return r;
  } finally {
    await holder.end({ timeout: 1 });
    await co.stop();
  }
}
