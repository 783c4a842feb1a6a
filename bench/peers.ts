/**
 * The peers a user would pick instead of Meshwork, measured by
 * `npm run bench:compare` in the same run and on the same PostgreSQL and
 * Redis (devDependencies of the benchmark only): pg-boss 10.4.2, BullMQ
 * 6.7.0 on Redis (BENCH_REDIS_URL, default redis://127.0.0.1:6379) and
 * BullMQ 6.7.0 on its PostgreSQL backend. Each, as graphile-worker is in
 * bench/compare.ts: `tasks` no-op jobs added 1,000 per call (its own bulk
 * call), then drained by `concurrency` concurrent handlers in this
 * process: jobs/s added, jobs/s drained (from the start of the workers
 * until the last job's completion is stored), and CPU per job (this
 * process, which runs the peer, and PostgreSQL; Redis is not counted).
 * PostgreSQL peers get a database of their own, created and dropped.
 */
import { createPostgresBackend, Queue, Worker } from "bullmq";
import { Redis } from "ioredis";
import PgBoss from "pg-boss";
import { cpuMeter, round2, withDatabase } from "./lib.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface PeerResult {
  name: string;
  version: string;
  store: "postgres" | "redis";
  addPerS: number;
  drainPerS: number;
  drainSeconds: number;
  cpuMsPerJob: { peer: number; postgres?: number };
}

/** pg-boss 10: insert() of 1,000 jobs; `concurrency` work() loops, each fetching 50 at a time. */
export async function pgBoss(tasks: number, concurrency: number): Promise<PeerResult> {
  return withDatabase("bench_pgboss", async (url) => {
    const boss = new PgBoss({ connectionString: url, max: concurrency + 4 });
    boss.on("error", (e) => process.stderr.write(`pg-boss: ${String(e)}\n`));
    await boss.start();
    try {
      const queue = "noop";
      await boss.createQueue(queue);
      const addStarted = performance.now();
      for (let done = 0; done < tasks; done += 1000) {
        const count = Math.min(1000, tasks - done);
        await boss.insert(Array.from({ length: count }, () => ({ name: queue, data: {} })));
      }
      const addPerS = tasks / ((performance.now() - addStarted) / 1000);
      let ran = 0;
      const started = performance.now();
      const cpu = cpuMeter();
      for (let i = 0; i < concurrency; i++) {
        await boss.work(queue, { batchSize: 50, pollingIntervalSeconds: 0.5 }, async (jobs) => {
          ran += jobs.length;
        });
      }
      // Done when every job ran and its completion is stored.
      for (;;) {
        if (ran >= tasks && (await boss.getQueueSize(queue, { before: "completed" })) === 0) break;
        await sleep(5);
      }
      const drainSeconds = (performance.now() - started) / 1000;
      const c = cpu(tasks);
      return {
        name: "pg-boss",
        version: "10.4.2",
        store: "postgres" as const,
        addPerS,
        drainPerS: tasks / drainSeconds,
        drainSeconds: round2(drainSeconds),
        cpuMsPerJob: { peer: c.client, postgres: c.postgres },
      };
    } finally {
      await boss.stop({ graceful: false, wait: true });
    }
  });
}

/** BullMQ 6: addBulk() of 1,000 jobs; one Worker of `concurrency`; on Redis or on PostgreSQL. */
export async function bullmq(
  tasks: number,
  concurrency: number,
  store: "redis" | "postgres",
): Promise<PeerResult> {
  const run = async (connection: string, backend?: typeof createPostgresBackend) => {
    const name = `noop-${process.pid}-${Date.now()}`;
    // The backend factory is the constructors' last argument (Redis when absent).
    // On Redis, clients built here (BullMQ cannot load ioredis itself from ESM).
    const clients: Redis[] = [];
    const redis = () => {
      const client = new Redis(connection, { maxRetriesPerRequest: null });
      clients.push(client);
      return client;
    };
    // On PostgreSQL, its schema made by its own migrations on first connect.
    const pg = { connectionString: connection, migrate: true };
    const queue = backend
      ? new Queue(name, { connection: pg }, backend)
      : new Queue(name, { connection: redis() });
    let closeWorker = async () => {};
    try {
      await queue.waitUntilReady();
      const addStarted = performance.now();
      for (let done = 0; done < tasks; done += 1000) {
        const count = Math.min(1000, tasks - done);
        await queue.addBulk(Array.from({ length: count }, () => ({ name: "noop", data: {} })));
      }
      const addPerS = tasks / ((performance.now() - addStarted) / 1000);
      let completed = 0;
      let finished: () => void = () => {};
      const allDone = new Promise<void>((r) => {
        finished = r;
      });
      const started = performance.now();
      const cpu = cpuMeter(undefined, store === "postgres");
      const processor = async () => {};
      const worker = backend
        ? new Worker(name, processor, { connection: pg, concurrency }, backend)
        : new Worker(name, processor, { connection: redis(), concurrency });
      closeWorker = () => worker.close();
      // "completed" is emitted once the job's completion is stored.
      worker.on("completed", () => {
        completed++;
        if (completed >= tasks) finished();
      });
      worker.on("error", (e) => process.stderr.write(`bullmq: ${String(e)}\n`));
      await allDone;
      const drainSeconds = (performance.now() - started) / 1000;
      const c = cpu(tasks);
      return {
        name: store === "redis" ? "bullmq-redis" : "bullmq-postgres",
        version: "6.7.0",
        store,
        addPerS,
        drainPerS: tasks / drainSeconds,
        drainSeconds: round2(drainSeconds),
        cpuMsPerJob: { peer: c.client, ...(store === "postgres" && { postgres: c.postgres }) },
      };
    } finally {
      await closeWorker();
      await queue.obliterate({ force: true }).catch(() => {});
      await queue.close();
      for (const client of clients) client.disconnect();
    }
  };
  if (store === "redis") return run(process.env.BENCH_REDIS_URL ?? "redis://127.0.0.1:6379");
  return withDatabase("bench_bullmq", (url) => run(url, createPostgresBackend));
}
