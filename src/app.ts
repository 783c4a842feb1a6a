import { setMaxListeners } from "node:events";
import { createBlobStore, type S3Module } from "./artifacts/blob-stores.js";
import { createGuard } from "./auth/guard.js";
import type { Config } from "./config.js";
import { DomainError } from "./core/errors.js";
import type { Database } from "./db/database.js";
import { createReadiness } from "./db/readiness.js";
import { createUpkeep, type UpkeepReading } from "./db/upkeep.js";
import { createWorkerCache } from "./fleet/cache.js";
import { capacityOf } from "./fleet/convert.js";
import { createDispatcher } from "./fleet/dispatch.js";
import { createDispatchStore } from "./fleet/dispatch-store.js";
import { createHeartbeatBuffer } from "./fleet/heartbeats.js";
import { createCompleteCalls } from "./leases/complete-calls.js";
import type { ExpirySweep } from "./leases/store.js";
import { createSweeper } from "./leases/sweeper.js";
import { createClaimWakeups, readyCounts } from "./leases/wakeup.js";
import type { Logger } from "./log.js";
import { createLogStore } from "./logs/store.js";
import { createLogTail } from "./logs/tail.js";
import { createMetrics } from "./metrics/metrics.js";
import { createScheduleTicker } from "./schedules/ticker.js";
import { createShareBook } from "./scheduling/book.js";
import { demandByWorkload, type Pool, readDemand } from "./scheduling/demand.js";
import { createSchedulingStore } from "./scheduling/store.js";
import { createWaitingReasons } from "./scheduling/why.js";
import { createStores, createWithTx } from "./stores.js";
import { createTaskEvents } from "./tasks/events.js";
import { createRetention } from "./tasks/retention.js";
import type { Tracing } from "./tracing/tracing.js";

/**
 * Everything the handlers share, built from an open database. No globals:
 * tests build as many as they like. Each service takes only the parts it
 * uses (its own `…Deps` type); the app satisfies all of them. `s3` is
 * blob-s3.ts, needed with `--blob-store s3://…` only (loadS3Module);
 * `tracing` is the span export of `--otel-endpoint` (tracing/load.ts).
 */
export function createApp(
  database: Database,
  config: Config,
  log: Logger,
  s3?: S3Module,
  tracing?: Tracing,
) {
  // A span per statement, under the RPC that made it.
  if (tracing) database.statements.observe(tracing.statements);
  // One replica's view of the share tree, read on the housekeeping handle:
  // it plans this replica's claims (scheduling/book.ts).
  const shareBook = createShareBook({
    store: createSchedulingStore(database.housekeeping, config.heartbeatIntervalSeconds),
    config,
    log,
  });
  // How far the sweeper has expired leases: claims look for expired ones
  // from there on (leases/claim.ts, ExpirySweep).
  const sweep: ExpirySweep = { sweptTo: null };
  const stores = createStores(database.db, config, shareBook, sweep);
  const waitingReasons = createWaitingReasons({
    db: database.db,
    heartbeatIntervalSeconds: config.heartbeatIntervalSeconds,
    shares: () => shareBook.snapshot(),
  });
  // The database's upkeep (db/upkeep.ts): its tables' dead rows and the
  // oldest open transaction, read every 10 s; vacuums with --vacuum on.
  const upkeep = createUpkeep(database.upkeep, { vacuum: config.vacuum });
  let upkeepReading: UpkeepReading | undefined;
  // Per app, not prom-client's global registry: tests build many apps.
  const metrics = createMetrics({
    upkeep: () => upkeepReading,
    statements: database.statements,
    pool: () => database.pool(),
    liveTasks: () => stores.tasks.liveByWorkload(),
    shares: () => [...shareBook.snapshot().tree.values()],
    async workersNeeded() {
      const [backlog, workers] = await Promise.all([stores.tasks.backlog(), stores.fleet.all()]);
      const demand = await demandByWorkload(
        backlog.map((b) => b.workload),
        workers.map((w) => ({ ...w, capacity: capacityOf(w) })),
        (pool) => readDemand(database.db, pool),
      );
      return [...demand].map(([workload, d]) => ({ workload, workersNeeded: d.workersNeeded }));
    },
  });
  const blobs = createBlobStore(config, database, s3);
  const events = createTaskEvents();
  const wakeups = createClaimWakeups();
  // The sweeper's stores use the database's housekeeping handle (its own
  // connection on PostgreSQL), so it keeps running while requests exhaust
  // the pool. Buffered heartbeats are written by the sweeper: the same.
  const housekeeping = createStores(database.housekeeping, config, undefined, sweep);
  // Renewals, stream messages, completions and the fleet's status on the pool's urgent lane.
  const urgent = createStores(database.urgent, config, shareBook, sweep);
  const heartbeats = createHeartbeatBuffer(housekeeping.fleet);
  // Read on the urgent lane: every claim, renewal and completion of a worker token asks it.
  const workerCache = createWorkerCache(urgent.fleet);
  const guard = createGuard({
    enabled: config.auth === "on",
    tokens: stores.tokens,
    knownTokens: urgent.tokens,
    // Read for the tokens that hold open streams, every half second, off the request pool.
    revokedAmong: (ids) => housekeeping.tokens.revokedAmong(ids),
    ownerOf: (workerId) =>
      workerCache.get(workerId).then(
        (w) => w.ownerTokenId,
        (error: unknown) => {
          if (error instanceof DomainError && error.kind === "not_found") return undefined;
          throw error;
        },
      ),
    rateLimit: config.rateLimit,
    rateBurst: config.rateBurst,
    rateLimitAdmin: config.rateLimitAdmin,
    authFailureRate: config.authFailureRate,
    authFailureBurst: config.authFailureBurst,
    maxPendingAuthBytes: config.maxPendingAuthBytes,
    log,
    onFailure: (why) => metrics.authFailures.inc({ why }),
  });
  // Concurrent CompleteTask and CompleteTasks calls share one statement (group commit).
  const complete = createCompleteCalls((items) => urgent.leases.complete(items));
  const sweeper = createSweeper(
    { leases: housekeeping.leases, heartbeats, events, wakeups, log, metrics },
    config.sweepIntervalMs,
  );
  // Every replica delivers placed tasks with dispatch; a delivery's row
  // lock and claim keep each to one replica (fleet/dispatch-store.ts).
  const dispatcher = createDispatcher({
    store: createDispatchStore(database.db),
    placement: stores.placement,
    config,
    events,
    log,
    metrics,
  });
  // Every replica ticks the due schedules; a tick's row lock keeps it to one (schedules/store.ts).
  const scheduleTicker = createScheduleTicker(
    { schedules: stores.schedules, config, log, metrics },
    config.sweepIntervalMs,
  );
  // Old finished tasks, on the housekeeping handle too: one replica at a
  // time, in small batches (tasks/retention.ts).
  const retention = createRetention(
    { db: database.housekeeping, blobDb: database.db, blobs, log },
    { retentionMs: config.retentionMs },
  );
  const shutdown = new AbortController();
  // Every in-flight request listens for shutdown: no listener limit applies.
  setMaxListeners(0, shutdown.signal);
  let unlisten: (() => Promise<void>) | undefined;
  let blobSweep: NodeJS.Timeout | undefined;
  // What crashed uploads left in the blob store (temporary files, chunks,
  // objects, multipart uploads) is removed once an hour old, now and then,
  // while the coordinator runs: a store shared by replicas cannot clear
  // them at start-up, another replica may be uploading.
  const removeAbandonedBlobs = () =>
    blobs.removeAbandoned?.().then(
      (removed) => {
        if (removed > 0) log.info({ removed }, "removed abandoned blob uploads");
      },
      (error: unknown) => log.warn({ err: error }, "removing abandoned blob uploads failed"),
    );
  // Workers LOST longer than --worker-retention are removed, every minute,
  // on the housekeeping connection; a DELETE any replica may run.
  let workerSweep: NodeJS.Timeout | undefined;
  const pruneLostWorkers = () =>
    housekeeping.fleet.pruneLost(config.workerRetentionMs / 1000).then(
      (removed) => {
        if (removed > 0)
          log.info({ removed }, "removed workers LOST longer than --worker-retention");
      },
      (error: unknown) => log.warn({ err: error }, "removing LOST workers failed"),
    );
  let upkeepTimer: NodeJS.Timeout | undefined;
  let upkeepRunning: Promise<void> | undefined;
  let warnedAt = 0;
  const upkeepOnce = async () => {
    // The figures are published before any vacuum: one may take minutes.
    const reading = await upkeep.read();
    upkeepReading = reading;
    const old = reading.oldest;
    if (old && old.seconds >= 60 && Date.now() - warnedAt >= 60_000) {
      warnedAt = Date.now();
      log.warn(
        { ...old, seconds: Math.round(old.seconds) },
        "an open transaction keeps the database from removing dead rows: claims slow down while it stays open (end it, or set idle_in_transaction_session_timeout)",
      );
    }
    for (const v of await upkeep.vacuumDue(reading, shutdown.signal)) {
      if (v.error !== undefined) {
        if (!shutdown.signal.aborted) {
          log.warn({ err: v.error, table: v.table }, "vacuum failed; tried again later");
        }
      } else if (v.ran) {
        metrics.vacuums.inc({ table: v.table });
        log.info(
          { table: v.table, removed: v.removed },
          "vacuumed a table whose dead rows piled up",
        );
      }
    }
  };
  const runUpkeep = (): Promise<void> => {
    upkeepRunning ??= upkeepOnce().finally(() => {
      upkeepRunning = undefined;
    });
    return upkeepRunning;
  };
  /**
   * The timer's run: a vacuum may outlast the interval, so one run at a
   * time, each failure logged once. `stop` does not wait for a run under
   * way, and closing the database ends it (PGlite lets the statement under
   * way finish; PostgreSQL's upkeep connection is cut after 5 s), so what
   * fails once stopping has begun is not a fault to report, and no further
   * table is vacuumed.
   */
  const upkeepTick = () => {
    if (upkeepRunning) return;
    runUpkeep().catch((error: unknown) => {
      if (!shutdown.signal.aborted) log.warn({ err: error }, "database upkeep failed");
    });
  };
  return {
    database,
    /** Reads the database's upkeep figures and vacuums what is due (tests call it instead of waiting 10 s). */
    runUpkeep,
    /** Whether the database answers (/readyz, grpc.health.v1.Health): one ping at a time, kept 500 ms. */
    ready: createReadiness(() => database.ping(), { cacheMs: 500, timeoutMs: 2000 }),
    config,
    log,
    ...stores,
    /** Stores on the database's urgent lane (db/database.ts): renewals, completions, the fleet's status. */
    urgent: { leases: urgent.leases, fleet: urgent.fleet, tasks: urgent.tasks },
    /** The stores bound to one transaction, for changes that commit together. */
    withTx: createWithTx(database.db, config),
    blobs,
    events,
    wakeups,
    heartbeats,
    workerCache,
    /** Authentication, roles, worker ownership and rate limits (src/auth/). */
    guard,
    /** Task log tails: appends under the lease check, capped per task, pages and watches (src/logs/). */
    logTail: createLogTail({
      store: createLogStore(database.db, config.logLinesPerTask),
      config,
    }),
    /** The Prometheus metrics served at /metrics (src/metrics/, docs/metrics.md). */
    metrics,
    /** Span export (OpenTelemetry), with `--otel-endpoint` only. */
    tracing,
    complete,
    sweeper,
    /** Delivers placed tasks with dispatch (fleet/dispatch.ts); started with the sweeper. */
    dispatcher,
    /** Runs the due schedules' ticks (schedules/ticker.ts); started with the sweeper. */
    scheduleTicker,
    retention,
    /** The share tree as this replica last read it (scheduling/book.ts). */
    shareBook,
    /** Why a PENDING task waits (scheduling/why.ts). */
    waitingReasons,
    /** What a pool of work needs, in workers (scheduling/demand.ts), read on the urgent lane. */
    demand: (pool: Pool) => readDemand(database.urgent, pool),
    /** Aborted when the server begins to shut down: long polls and streams end. */
    // Named as the global type: @types/node's own is module-local, and the
    // build's declaration emit (tsconfig.build.json) cannot name it.
    shutdownSignal: shutdown.signal as AbortSignal,
    /** Subscribes to task-ready notifications and starts the sweeper and retention. */
    async start(options: { sweeper?: boolean } = {}): Promise<void> {
      unlisten = await database.listen("meshwork_task_ready", (payload) =>
        wakeups.notify(readyCounts(payload)),
      );
      shareBook.start();
      if (options.sweeper !== false) {
        sweeper.start();
        dispatcher.start();
        scheduleTicker.start();
        retention.start();
        upkeepTimer = setInterval(upkeepTick, 10_000);
        upkeepTimer.unref();
        if (config.workerRetentionMs > 0) {
          workerSweep = setInterval(pruneLostWorkers, 60_000);
          workerSweep.unref();
        }
      }
      if (blobs.removeAbandoned) {
        void removeAbandonedBlobs();
        blobSweep = setInterval(removeAbandonedBlobs, 10 * 60 * 1000);
        blobSweep.unref();
      }
    },
    /** Ends long polls and streams, stops the sweeper, writes pending heartbeats. */
    async stop(): Promise<void> {
      shutdown.abort();
      guard.stop();
      clearInterval(blobSweep);
      clearInterval(workerSweep);
      // A vacuum under way is not waited for: closing the database ends it (upkeepTick).
      clearInterval(upkeepTimer);
      await sweeper.stop();
      await dispatcher.stop();
      await scheduleTicker.stop();
      await retention.stop();
      await shareBook.stop();
      await unlisten?.();
      await heartbeats.flush().catch(() => {});
    },
  };
}

export type App = ReturnType<typeof createApp>;
