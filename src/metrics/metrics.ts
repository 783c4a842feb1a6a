import {
  Counter,
  collectDefaultMetrics,
  Gauge,
  Histogram,
  type LabelValues,
  Registry,
} from "prom-client";
import type { StatementEvents } from "../db/observe.js";
import type { UpkeepReading } from "../db/upkeep.js";
import { upkeepMetrics } from "./upkeep.js";

/** Non-terminal tasks of one workload and state, as the task gauges read them. */
export interface LiveTaskCount {
  workload: string;
  state: string;
  count: number;
  /** Seconds since the oldest task of the group was created (database clock); PENDING groups only. */
  oldestSeconds: number | null;
}

/** What the metrics read when scraped. */
export interface MetricsDeps {
  /** Each statement the database sends (db/observe.ts). */
  statements: StatementEvents;
  /** Connections of the request pool: its size, those in use and callers waiting for one. */
  pool(): { size: number; inUse: number; waiting: number };
  /** PENDING, ASSIGNED and RUNNING tasks by workload and state (tasks/store.ts liveByWorkload). */
  liveTasks(): Promise<LiveTaskCount[]>;
  /** The share tree as this replica last read it (scheduling/book.ts): fractions of the fleet. */
  shares?(): ShareFigures[];
  /** Workers each backlogged workload needs (scheduling/demand.ts demandByWorkload). */
  workersNeeded?(): Promise<{ workload: string; workersNeeded: number }[]>;
  /** The database upkeep's last reading (db/upkeep.ts). */
  upkeep?(): UpkeepReading | undefined;
}

/** One share's figures, as fractions of the fleet. */
export interface ShareFigures {
  path: string;
  entitlement: number;
  usage: number;
  allocation: number;
}

/** Shares /metrics names; the rest are summed as "_other" (share paths are the clients' to choose). */
export const maxShares = 100;

/** How long a scrape reuses the task counts it read: a scrape storm costs one query per window. */
const taskCountsTtlMs = 2000;

/** Seconds: from a sub-millisecond statement to a 30 s long poll. */
const latencyBuckets = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
];

/**
 * The coordinator's Prometheus metrics (docs/metrics.md), in a registry of
 * its own: tests build many apps in one process, and each app's counters
 * must start at zero. Counters are incremented where the event happens
 * (services, sweeper, byte routes); gauges of the task table and the pool
 * are read at scrape time. Labels hold only bounded values: service and
 * method names from the descriptors, Connect code names, route names,
 * statement names (never SQL text or parameters), task states and
 * workloads.
 */
export function createMetrics(deps: MetricsDeps) {
  const registry = new Registry();
  const registers = [registry];

  const rpcRequests = new Counter({
    name: "meshwork_rpc_requests_total",
    help: "RPCs finished, by service, method and Connect code (streams count when they end).",
    labelNames: ["service", "method", "code"] as const,
    registers,
  });
  const rpcDuration = new Histogram({
    name: "meshwork_rpc_duration_seconds",
    help: "RPC duration from the request to the last response message, by service, method and code.",
    labelNames: ["service", "method", "code"] as const,
    buckets: latencyBuckets,
    registers,
  });
  const httpRequests = new Counter({
    name: "meshwork_http_requests_total",
    help: "Plain HTTP requests (byte routes, REST, health, metrics) by route, method and status.",
    labelNames: ["route", "method", "status"] as const,
    registers,
  });
  const httpDuration = new Histogram({
    name: "meshwork_http_duration_seconds",
    help: "Plain HTTP request duration until the response is closed, by route, method and status.",
    labelNames: ["route", "method", "status"] as const,
    buckets: latencyBuckets,
    registers,
  });
  const tasksCreated = new Counter({
    name: "meshwork_tasks_created_total",
    help: "Tasks created, by workload.",
    labelNames: ["workload"] as const,
    registers,
  });
  const claims = new Counter({
    name: "meshwork_claims_total",
    help: "Tasks leased to workers by claims, by workload.",
    labelNames: ["workload"] as const,
    registers,
  });
  const completions = new Counter({
    name: "meshwork_completions_total",
    help: "Tasks completed (CompleteTask, CompleteTasks, REST), by workload: each task once.",
    labelNames: ["workload"] as const,
    registers,
  });
  const completionRepeats = new Counter({
    name: "meshwork_completion_repeats_total",
    help: "Identical repeats of a completion already accepted (answered with the task again, changing nothing), by workload.",
    labelNames: ["workload"] as const,
    registers,
  });
  const failures = new Counter({
    name: "meshwork_failures_total",
    help: "Attempts failed by their worker (FailTask, REST), by workload and whether the task will retry.",
    labelNames: ["workload", "outcome"] as const,
    registers,
  });
  const leaseExpiries = new Counter({
    name: "meshwork_lease_expiries_total",
    help: "Leases the sweeper found expired, by what became of the task (retry: PENDING again, failed: attempts used up).",
    labelNames: ["outcome"] as const,
    registers,
  });
  const sweeperRuns = new Counter({
    name: "meshwork_sweeper_runs_total",
    help: "Sweeps run, by result (ok or error).",
    labelNames: ["result"] as const,
    registers,
  });
  const sweeperDuration = new Histogram({
    name: "meshwork_sweeper_duration_seconds",
    help: "Duration of one sweep.",
    buckets: latencyBuckets,
    registers,
  });
  const dispatches = new Counter({
    name: "meshwork_dispatches_total",
    help: "Delivery requests of pushed tasks to their workers, by outcome (accepted, duplicate, refused, failed, unreachable, timeout, forbidden).",
    labelNames: ["outcome"] as const,
    registers,
  });
  const dispatchDuration = new Histogram({
    name: "meshwork_dispatch_duration_seconds",
    help: "Duration of one delivery request, by outcome.",
    labelNames: ["outcome"] as const,
    buckets: latencyBuckets,
    registers,
  });
  const artifactBytesIn = new Counter({
    name: "meshwork_artifact_bytes_in_total",
    help: "Artifact bytes stored (uploads over RPC and HTTP, inline task inputs), counted when the upload is accepted.",
    registers,
  });
  const artifactBytesOut = new Counter({
    name: "meshwork_artifact_bytes_out_total",
    help: "Artifact bytes sent (DownloadArtifact and the HTTP byte routes).",
    registers,
  });
  const authFailures = new Counter({
    name: "meshwork_auth_failures_total",
    help: "Requests refused before their body was read because of their credentials: why is missing, malformed, invalid (unknown or revoked), throttled (the source failed too often: 429) or busy (too many lookups pending: 503).",
    labelNames: ["why"] as const,
    registers,
  });
  const corruptBlobs = new Counter({
    name: "meshwork_artifact_corrupt_total",
    help: "Stored artifact bytes found not to hash to their SHA-256 when read (a download ended with an error, or meshwork artifact verify).",
    registers,
  });
  const statementDuration = new Histogram({
    name: "meshwork_db_statement_duration_seconds",
    help: "Database statement duration by statement name (a transaction is observed as a whole).",
    labelNames: ["statement"] as const,
    buckets: latencyBuckets,
    registers,
  });
  const statementErrors = new Counter({
    name: "meshwork_db_statement_errors_total",
    help: "Database statements that failed, by statement name.",
    labelNames: ["statement"] as const,
    registers,
  });
  new Gauge({
    name: "meshwork_db_pool_connections",
    help: "Request pool connections: size, in_use, and waiting (callers waiting for one).",
    labelNames: ["state"] as const,
    registers,
    collect() {
      const { size, inUse, waiting } = deps.pool();
      this.set({ state: "size" }, size);
      this.set({ state: "in_use" }, inUse);
      this.set({ state: "waiting" }, waiting);
    },
  });

  let taskCounts: { at: number; read: Promise<LiveTaskCount[]> } | undefined;
  const liveTasks = (): Promise<LiveTaskCount[]> => {
    const now = Date.now();
    if (!taskCounts || now - taskCounts.at > taskCountsTtlMs) {
      const read = deps.liveTasks().then(capWorkloads);
      // A failed read is not kept: the next scrape asks again.
      read.catch(() => {
        if (taskCounts?.read === read) taskCounts = undefined;
      });
      taskCounts = { at: now, read };
    }
    return taskCounts.read;
  };
  new Gauge({
    name: "meshwork_tasks",
    help: "Non-terminal tasks (PENDING, ASSIGNED, RUNNING) by state and workload, read at scrape time (cached 2 s).",
    labelNames: ["state", "workload"] as const,
    registers,
    async collect() {
      // Groups that emptied since the last scrape go to 0 by disappearing.
      this.reset();
      const rows = await liveTasks().catch(() => []);
      for (const r of rows) this.set({ state: r.state, workload: r.workload }, r.count);
    },
  });
  new Gauge({
    name: "meshwork_backlog_oldest_pending_seconds",
    help: "Age of the oldest PENDING task per workload (database clock), read at scrape time (cached 2 s).",
    labelNames: ["workload"] as const,
    registers,
    async collect() {
      this.reset();
      const rows = await liveTasks().catch(() => []);
      for (const r of rows) {
        if (r.state === "PENDING" && r.oldestSeconds !== null) {
          this.set({ workload: r.workload }, r.oldestSeconds);
        }
      }
    },
  });

  // The shares with the most entitlement or use keep their names.
  const topShares = (): ShareFigures[] => {
    const all = deps.shares?.() ?? [];
    if (all.length <= maxShares) return all;
    const sorted = [...all].sort(
      (a, b) => b.entitlement + b.allocation - (a.entitlement + a.allocation),
    );
    const other = { path: otherWorkloads, entitlement: 0, usage: 0, allocation: 0 };
    for (const s of sorted.slice(maxShares - 1)) {
      other.entitlement += s.entitlement;
      other.usage += s.usage;
      other.allocation += s.allocation;
    }
    return [...sorted.slice(0, maxShares - 1), other];
  };
  for (const [field, help] of [
    ["entitlement", "the fraction of the fleet it is entitled to now (0 without work)"],
    [
      "usage",
      "its decayed usage: the fraction of the fleet its leases held, averaged with --share-half-life",
    ],
    ["allocation", "the fraction of the fleet its live leases hold now (dominant resource)"],
  ] as const) {
    new Gauge({
      name: `meshwork_share_${field}`,
      help: `Each share-tree node's ${field}: ${help}. From the share book (refreshed every second); at most ${maxShares} shares, the rest as _other.`,
      labelNames: ["share"] as const,
      registers,
      collect() {
        this.reset();
        for (const s of topShares()) this.set({ share: s.path }, s[field]);
      },
    });
  }
  let needed:
    | { at: number; read: Promise<{ workload: string; workersNeeded: number }[]> }
    | undefined;
  new Gauge({
    name: "meshwork_workers_needed",
    help: "Workers each backlogged workload's PENDING and leased tasks need, by resources, counted in its largest live worker (GetFleetStatus' workers_needed), read at scrape time (cached 2 s).",
    labelNames: ["workload"] as const,
    registers,
    async collect() {
      this.reset();
      if (!deps.workersNeeded) return;
      const now = Date.now();
      if (!needed || now - needed.at > taskCountsTtlMs) {
        needed = { at: now, read: deps.workersNeeded() };
      }
      const rows = await needed.read.catch(() => []);
      for (const r of rows.slice(0, maxWorkloads))
        this.set({ workload: r.workload }, r.workersNeeded);
    },
  });

  new Gauge({
    name: "meshwork_task_gauges_up",
    help: "1 when this scrape read the task gauges, 0 when the database did not answer (they are then absent; the other metrics are served).",
    registers,
    async collect() {
      this.set(
        await liveTasks().then(
          () => 1,
          () => 0,
        ),
      );
    },
  });

  // Workload names are the clients' to choose: each new one would add
  // series for the life of the process. The first `maxWorkloads` names
  // seen keep theirs; later ones are counted together as "_other".
  const workloads = new Set<string>();
  const workloadLabel = (name: string): string => {
    if (workloads.has(name)) return name;
    if (workloads.size >= maxWorkloads) return otherWorkloads;
    workloads.add(name);
    return name;
  };
  const byWorkload = <T extends string>(counter: Counter<T>) => ({
    inc(labels: LabelValues<T> & { workload: string }, value = 1) {
      counter.inc({ ...labels, workload: workloadLabel(labels.workload) }, value);
    },
  });

  deps.statements.observe({
    started(statement) {
      const end = statementDuration.startTimer({ statement });
      return (error) => {
        end();
        if (error !== undefined) statementErrors.inc({ statement });
      };
    },
  });

  const vacuums = upkeepMetrics(registers, () => deps.upkeep?.());

  let processMetrics = false;
  return {
    /** The registry /metrics serves. */
    registry,
    /**
     * The metrics in the Prometheus text format. Node's process metrics
     * (prom-client's default set) join at the first scrape: they start an
     * event-loop monitor and a GC observer, which an app never scraped (a
     * test's) need not run.
     */
    scrape(): Promise<string> {
      if (!processMetrics) {
        processMetrics = true;
        collectDefaultMetrics({ register: registry });
      }
      return registry.metrics();
    },
    rpcRequests,
    rpcDuration,
    httpRequests,
    httpDuration,
    tasksCreated: byWorkload(tasksCreated),
    claims: byWorkload(claims),
    completions: byWorkload(completions),
    completionRepeats: byWorkload(completionRepeats),
    failures: byWorkload(failures),
    leaseExpiries,
    sweeperRuns,
    sweeperDuration,
    dispatches,
    dispatchDuration,
    artifactBytesIn,
    artifactBytesOut,
    authFailures,
    corruptBlobs,
    vacuums,
  };
}

export type Metrics = ReturnType<typeof createMetrics>;

/**
 * The task gauges' rows with at most `maxWorkloads` workloads: the ones
 * with the most live tasks keep their names, the rest are summed per state
 * as `otherWorkloads` (the oldest pending age is the oldest among them).
 */
export function capWorkloads(rows: LiveTaskCount[]): LiveTaskCount[] {
  const totals = new Map<string, number>();
  for (const r of rows) totals.set(r.workload, (totals.get(r.workload) ?? 0) + r.count);
  if (totals.size <= maxWorkloads) return rows;
  const kept = new Set(
    [...totals]
      .sort((a, b) => b[1] - a[1])
      .slice(0, maxWorkloads - 1)
      .map(([w]) => w),
  );
  const out = rows.filter((r) => kept.has(r.workload));
  const other = new Map<string, LiveTaskCount>();
  for (const r of rows) {
    if (kept.has(r.workload)) continue;
    const o = other.get(r.state) ?? {
      ...r,
      workload: otherWorkloads,
      count: 0,
      oldestSeconds: null,
    };
    o.count += r.count;
    if (r.oldestSeconds !== null)
      o.oldestSeconds = Math.max(o.oldestSeconds ?? r.oldestSeconds, r.oldestSeconds);
    other.set(r.state, o);
  }
  return [...out, ...other.values()];
}

/** Distinct workload names the work counters label by; the rest are `otherWorkloads`. */
export const maxWorkloads = 500;
export const otherWorkloads = "_other";
