import { join } from "node:path";
import { parseArgs } from "node:util";
import { type DispatchConfig, dispatchFlags, readDispatchFlags } from "./config/dispatch.js";
import { poolDefaults } from "./db/pool-gate.js";
import { postgresUrlProblem } from "./db/postgres-url.js";

/** Everything `meshwork serve` can be told, from flags or the environment (README: Configuration). */
export interface Config extends DispatchConfig {
  /** host:port to listen on. */
  listen: string;
  dataDir: string;
  /** PostgreSQL URL; empty = embedded PGlite in `<dataDir>/db`. */
  databaseUrl: string;
  /** PostgreSQL: connections in the request pool (the sweeper has one more of its own). */
  dbPoolSize: number;
  /** PostgreSQL: longest wait for a free pool connection, in ms; then `unavailable`. */
  dbAcquireTimeoutMs: number;
  /** PostgreSQL: `statement_timeout` of every connection, in ms; 0 = none. */
  dbStatementTimeoutMs: number;
  /** Base of artifact URIs; default http://<listen>. */
  publicUrl: string;
  auth: "on" | "off";
  blobDir: string;
  /** Where artifact bytes live: files under `blobDir`, the database, or an S3 bucket. */
  blobStore: BlobStoreConfig;
  logLevel: string;
  /** `auto` (the default): readable lines when stdout is a terminal, JSON lines otherwise. */
  logFormat: "auto" | "json" | "pretty";
  /** GET /metrics without a token (for a Prometheus on a trusted network); default off. */
  metricsPublic: boolean;
  /** Whether the coordinator vacuums its own tables when their dead rows pile up (db/upkeep.ts); default on. */
  vacuum: boolean;
  /** OTLP/HTTP endpoint that spans are exported to (e.g. http://127.0.0.1:4318); "" = no tracing SDK loaded. */
  otelEndpoint: string;
  /** Seconds between worker heartbeats; a worker is LOST after 3 missed intervals. */
  heartbeatIntervalSeconds: number;
  /** Terminal tasks finished longer ago than this are deleted (README: Retention), in ms; 0 = kept forever. */
  retentionMs: number;
  /** Workers LOST (no heartbeat) longer than this are removed (README: Retention), in ms; 0 = kept. */
  workerRetentionMs: number;
  /** How often the sweeper runs, in milliseconds. */
  sweepIntervalMs: number;
  /** Grace period for in-flight requests on shutdown, in milliseconds. */
  shutdownGraceMs: number;
  /** Largest accepted message, in bytes. */
  readMaxBytes: number;
  /** Largest artifact, in bytes (default 1 GiB). */
  maxArtifactBytes: number;
  /** PEM certificate and key files: serve TLS (ALPN h2 / http/1.1) instead of cleartext. */
  tlsCert: string;
  tlsKey: string;
  /** Requests per second allowed per token (token bucket); 0 = no limit. */
  rateLimit: number;
  /** Burst size of the token bucket (requests). */
  rateBurst: number;
  /** Whether admin tokens are rate limited too (default: not). */
  rateLimitAdmin: boolean;
  /** Longest deadline a client may ask for (grpc-timeout, connect-timeout-ms), in milliseconds; longer ones are clamped. */
  maxTimeoutMs: number;
  /** HTTP/1.1: time to receive a request's headers, in milliseconds (slow clients are cut off). */
  headersTimeoutMs: number;
  /** HTTP/1.1: time to receive a whole request, body included, in milliseconds. */
  requestTimeoutMs: number;
  /** Idle connections and HTTP/2 sessions are closed after this many milliseconds. */
  idleTimeoutMs: number;
  /** HTTP/2: concurrent streams per session. */
  maxConcurrentStreams: number;
  /** Largest request header block, in bytes (HTTP/1.1 and HTTP/2). */
  maxHeaderBytes: number;
  /** Open connections per source address (an IPv6 /64); 0 = no limit. */
  maxConnectionsPerSource: number;
  /** A request body that makes no progress for this long is ended (408 / RST_STREAM), in ms. */
  bodyTimeoutMs: number;
  /** Failed authentications per second per source address (token bucket); 0 = no limit. */
  authFailureRate: number;
  /** Burst of the failed-authentication bucket. */
  authFailureBurst: number;
  /** Bytes that requests waiting for their token to be looked up may buffer, server-wide; 0 = no cap. */
  maxPendingAuthBytes: number;
  /** Log lines kept per task (the oldest are dropped past it; src/logs/). */
  logLinesPerTask: number;
  /** Log lines a task may send per second (token bucket, burst 10 s of it); 0 = no limit. */
  logLinesPerSecond: number;
  /** The share of a task that names none: a path, or "" for the creating token's name. */
  defaultShare: string;
  /** Half-life of a share's usage, in ms (docs/scheduling.md). */
  shareHalfLifeMs: number;
  /** A large task claimable this long is given a reservation (ms); 0 = never. */
  reserveAfterMs: number;
  /** host:port of the KEDA external-scaler listener; "" = none. */
  kedaListen: string;
  /** PEM CA bundle: the KEDA listener requires client certificates signed by it. */
  kedaClientCa: string;
}

/**
 * `--blob-store fs` (files under `--blob-dir`, the default), `postgres` (in
 * the coordinator's own PostgreSQL database) or `s3://bucket/prefix`
 * (S3-compatible object storage; endpoint and keys from the AWS_* variables).
 */
export type BlobStoreConfig =
  | { kind: "fs" }
  | { kind: "postgres" }
  | { kind: "s3"; bucket: string; prefix: string };

/** A URL as it may be shown in logs and output: without a user or password in it. */
export function shownUrl(url: string): string {
  try {
    const u = new URL(url);
    u.username = "";
    u.password = "";
    return u.toString().replace(/\/$/, "");
  } catch {
    return "(not a URL)";
  }
}

/** Where the first admin token is written: `<data dir>/admin.token`. */
export function adminTokenPath(dataDir: string): string {
  return join(dataDir, "admin.token");
}

export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

const flags = {
  listen: { type: "string", env: "MESHWORK_LISTEN" },
  "data-dir": { type: "string", env: "MESHWORK_DATA_DIR" },
  "database-url": { type: "string", env: "DATABASE_URL" },
  "db-pool-size": { type: "string", env: "MESHWORK_DB_POOL_SIZE" },
  "db-acquire-timeout": { type: "string", env: "MESHWORK_DB_ACQUIRE_TIMEOUT" },
  "db-statement-timeout": { type: "string", env: "MESHWORK_DB_STATEMENT_TIMEOUT" },
  "public-url": { type: "string", env: "MESHWORK_PUBLIC_URL" },
  auth: { type: "string", env: "MESHWORK_AUTH" },
  "blob-dir": { type: "string", env: "MESHWORK_BLOB_DIR" },
  "blob-store": { type: "string", env: "MESHWORK_BLOB_STORE" },
  "log-level": { type: "string", env: "MESHWORK_LOG_LEVEL" },
  "log-format": { type: "string", env: "MESHWORK_LOG_FORMAT" },
  "metrics-public": { type: "string", env: "MESHWORK_METRICS_PUBLIC" },
  vacuum: { type: "string", env: "MESHWORK_VACUUM" },
  "otel-endpoint": { type: "string", env: "OTEL_EXPORTER_OTLP_ENDPOINT" },
  "heartbeat-interval": { type: "string", env: "MESHWORK_HEARTBEAT_INTERVAL" },
  retention: { type: "string", env: "MESHWORK_RETENTION" },
  "worker-retention": { type: "string", env: "MESHWORK_WORKER_RETENTION" },
  "read-max-bytes": { type: "string", env: "MESHWORK_READ_MAX_BYTES" },
  "max-artifact-bytes": { type: "string", env: "MESHWORK_MAX_ARTIFACT_BYTES" },
  "tls-cert": { type: "string", env: "MESHWORK_TLS_CERT" },
  "tls-key": { type: "string", env: "MESHWORK_TLS_KEY" },
  "rate-limit": { type: "string", env: "MESHWORK_RATE_LIMIT" },
  "rate-burst": { type: "string", env: "MESHWORK_RATE_BURST" },
  "rate-limit-admin": { type: "string", env: "MESHWORK_RATE_LIMIT_ADMIN" },
  "max-timeout": { type: "string", env: "MESHWORK_MAX_TIMEOUT" },
  "headers-timeout": { type: "string", env: "MESHWORK_HEADERS_TIMEOUT" },
  "request-timeout": { type: "string", env: "MESHWORK_REQUEST_TIMEOUT" },
  "idle-timeout": { type: "string", env: "MESHWORK_IDLE_TIMEOUT" },
  "max-concurrent-streams": { type: "string", env: "MESHWORK_MAX_CONCURRENT_STREAMS" },
  "max-header-bytes": { type: "string", env: "MESHWORK_MAX_HEADER_BYTES" },
  "max-connections-per-source": { type: "string", env: "MESHWORK_MAX_CONNECTIONS_PER_SOURCE" },
  "body-timeout": { type: "string", env: "MESHWORK_BODY_TIMEOUT" },
  "auth-failure-rate": { type: "string", env: "MESHWORK_AUTH_FAILURE_RATE" },
  "auth-failure-burst": { type: "string", env: "MESHWORK_AUTH_FAILURE_BURST" },
  "max-pending-auth-bytes": { type: "string", env: "MESHWORK_MAX_PENDING_AUTH_BYTES" },
  "log-lines-per-task": { type: "string", env: "MESHWORK_LOG_LINES_PER_TASK" },
  "log-lines-per-second": { type: "string", env: "MESHWORK_LOG_LINES_PER_SECOND" },
  "default-share": { type: "string", env: "MESHWORK_DEFAULT_SHARE" },
  "share-half-life": { type: "string", env: "MESHWORK_SHARE_HALF_LIFE" },
  "reserve-after": { type: "string", env: "MESHWORK_RESERVE_AFTER" },
  "keda-listen": { type: "string", env: "MESHWORK_KEDA_LISTEN" },
  "keda-client-ca": { type: "string", env: "MESHWORK_KEDA_CLIENT_CA" },
  ...dispatchFlags,
} as const;

/** Reads flags first, then the environment, then defaults. Throws ConfigError on a bad value. */
export function loadConfig(argv: string[], env: NodeJS.ProcessEnv = process.env): Config {
  const options = Object.fromEntries(
    Object.entries(flags).map(([name, f]) => [name, { type: f.type }]),
  ) as Record<keyof typeof flags, { type: "string" }>;
  let values: Partial<Record<keyof typeof flags, string>>;
  try {
    values = parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values;
  } catch (error) {
    throw new ConfigError((error as Error).message);
  }
  const get = (name: keyof typeof flags): string | undefined => {
    const v = values[name] ?? env[flags[name].env];
    return v === undefined || v === "" ? undefined : v;
  };
  const listen = get("listen") ?? "127.0.0.1:8080";
  const { host } = splitHostPort(listen);
  const dataDir = get("data-dir") ?? "./.meshwork";
  const auth = onOff("--auth", get("auth"), "on");
  if (auth === "off" && !isLoopback(host)) {
    throw new ConfigError(
      `--auth off is accepted only when listening on a loopback address, not ${host}: anyone who can reach ${listen} could act as any worker. Keep --auth on (the default) and use tokens (meshwork token create).`,
    );
  }
  const rateLimit = intFlag("--rate-limit", get("rate-limit"), 0, 0, 1_000_000);
  const rateLimitAdmin = onOff("--rate-limit-admin", get("rate-limit-admin"), "off");
  const logLevel = get("log-level") ?? "info";
  if (!["trace", "debug", "info", "warn", "error", "fatal", "silent"].includes(logLevel)) {
    throw new ConfigError(
      `--log-level ${logLevel} is not one of trace|debug|info|warn|error|silent`,
    );
  }
  const logFormat = get("log-format") ?? "auto";
  if (logFormat !== "auto" && logFormat !== "json" && logFormat !== "pretty") {
    throw new ConfigError(`--log-format ${logFormat} is not one of auto|json|pretty`);
  }
  const metricsPublic = onOff("--metrics-public", get("metrics-public"), "off");
  // The base URL, as OTEL_EXPORTER_OTLP_ENDPOINT means it; a full traces URL is taken too.
  const otelEndpoint = (get("otel-endpoint") ?? "")
    .replace(/\/+$/, "")
    .replace(/\/v1\/traces$/, "");
  if (otelEndpoint !== "") {
    try {
      const u = new URL(otelEndpoint);
      if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error();
    } catch {
      throw new ConfigError(
        "--otel-endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) must be an http(s) URL such as http://127.0.0.1:4318",
      );
    }
  }
  const tlsCert = get("tls-cert") ?? "";
  const tlsKey = get("tls-key") ?? "";
  if ((tlsCert === "") !== (tlsKey === "")) {
    throw new ConfigError("--tls-cert and --tls-key go together");
  }
  const scheme = tlsCert === "" ? "http" : "https";
  const publicUrl = (get("public-url") ?? `${scheme}://${listen}`).replace(/\/+$/, "");
  try {
    const u = new URL(publicUrl);
    if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error();
  } catch {
    throw new ConfigError(`--public-url ${publicUrl} is not an http(s) URL`);
  }
  const databaseUrl = get("database-url") ?? "";
  // The URL may hold a password: the problem's wording never repeats it.
  const databaseProblem = databaseUrl === "" ? undefined : postgresUrlProblem(databaseUrl);
  if (databaseProblem) throw new ConfigError(databaseProblem);
  const blobStore = parseBlobStore(get("blob-store") ?? "fs", databaseUrl);
  const scheduling = schedulingFlags(get, tlsCert);
  return {
    ...scheduling,
    ...readDispatchFlags(get, (message) => {
      throw new ConfigError(message);
    }),
    listen,
    dataDir,
    databaseUrl,
    dbPoolSize: intFlag("--db-pool-size", get("db-pool-size"), poolDefaults.poolSize, 1, 1000),
    dbAcquireTimeoutMs: intFlag(
      "--db-acquire-timeout",
      get("db-acquire-timeout"),
      poolDefaults.acquireTimeoutMs,
      1,
      600_000,
    ),
    dbStatementTimeoutMs: intFlag(
      "--db-statement-timeout",
      get("db-statement-timeout"),
      poolDefaults.statementTimeoutMs,
      0,
      86_400_000,
    ),
    publicUrl,
    auth,
    blobDir: get("blob-dir") ?? `${dataDir}/blobs`,
    blobStore,
    logLevel,
    logFormat,
    metricsPublic: metricsPublic === "on",
    vacuum: onOff("--vacuum", get("vacuum"), "on") === "on",
    otelEndpoint,
    heartbeatIntervalSeconds: intFlag(
      "--heartbeat-interval",
      get("heartbeat-interval"),
      15,
      1,
      3600,
    ),
    retentionMs: durationFlag("--retention", get("retention"), 7 * 86_400_000),
    workerRetentionMs: durationFlag("--worker-retention", get("worker-retention"), 86_400_000),
    sweepIntervalMs: 1000,
    shutdownGraceMs: 10_000,
    readMaxBytes: intFlag(
      "--read-max-bytes",
      get("read-max-bytes"),
      4 * 1024 * 1024,
      1024,
      1 << 30,
    ),
    maxArtifactBytes: intFlag(
      "--max-artifact-bytes",
      get("max-artifact-bytes"),
      1 << 30,
      1,
      Number.MAX_SAFE_INTEGER,
    ),
    tlsCert,
    tlsKey,
    rateLimit,
    rateBurst: intFlag(
      "--rate-burst",
      get("rate-burst"),
      Math.max(1, 2 * rateLimit),
      1,
      10_000_000,
    ),
    rateLimitAdmin: rateLimitAdmin === "on",
    maxTimeoutMs: 1000 * intFlag("--max-timeout", get("max-timeout"), 300, 1, 86_400),
    headersTimeoutMs: 1000 * intFlag("--headers-timeout", get("headers-timeout"), 10, 1, 3600),
    requestTimeoutMs: 1000 * intFlag("--request-timeout", get("request-timeout"), 600, 1, 86_400),
    idleTimeoutMs: 1000 * intFlag("--idle-timeout", get("idle-timeout"), 300, 1, 86_400),
    maxConcurrentStreams: intFlag(
      "--max-concurrent-streams",
      get("max-concurrent-streams"),
      100,
      1,
      1_000_000,
    ),
    maxHeaderBytes: intFlag("--max-header-bytes", get("max-header-bytes"), 16_384, 1024, 1 << 20),
    maxConnectionsPerSource: intFlag(
      "--max-connections-per-source",
      get("max-connections-per-source"),
      256,
      0,
      1_000_000,
    ),
    bodyTimeoutMs: 1000 * intFlag("--body-timeout", get("body-timeout"), 30, 1, 3600),
    authFailureRate: intFlag("--auth-failure-rate", get("auth-failure-rate"), 10, 0, 1_000_000),
    authFailureBurst: intFlag(
      "--auth-failure-burst",
      get("auth-failure-burst"),
      100,
      1,
      10_000_000,
    ),
    maxPendingAuthBytes: intFlag(
      "--max-pending-auth-bytes",
      get("max-pending-auth-bytes"),
      64 * 1024 * 1024,
      0,
      Number.MAX_SAFE_INTEGER,
    ),
    logLinesPerTask: intFlag("--log-lines-per-task", get("log-lines-per-task"), 1e4, 1, 1e7),
    logLinesPerSecond: intFlag("--log-lines-per-second", get("log-lines-per-second"), 1e3, 0, 1e6),
  };
}

/** The scheduling flags: shares, reservations, the KEDA listener (docs/scheduling.md). */
function schedulingFlags(get: (name: keyof typeof flags) => string | undefined, tlsCert: string) {
  // A path is checked by the share rules (core/scheduling.ts) when the app starts.
  const defaultShare = get("default-share") ?? "token";
  const kedaListen = get("keda-listen") ?? "";
  if (kedaListen !== "") splitHostPort(kedaListen);
  const kedaClientCa = get("keda-client-ca") ?? "";
  if (kedaClientCa !== "" && (kedaListen === "" || tlsCert === "")) {
    throw new ConfigError(
      "--keda-client-ca needs --keda-listen and a server certificate (--tls-cert, --tls-key): client certificates are checked over TLS",
    );
  }
  const halfLife = durationFlag("--share-half-life", get("share-half-life"), 300_000);
  if (halfLife === 0) throw new ConfigError("--share-half-life must be longer than 0");
  return {
    defaultShare: defaultShare === "token" ? "" : defaultShare,
    shareHalfLifeMs: halfLife,
    reserveAfterMs: durationFlag("--reserve-after", get("reserve-after"), 30_000),
    kedaListen,
    kedaClientCa,
  };
}

function parseBlobStore(v: string, databaseUrl: string): BlobStoreConfig {
  if (v === "fs") return { kind: "fs" };
  if (v === "postgres") {
    if (databaseUrl === "") {
      throw new ConfigError(
        "--blob-store postgres keeps artifact bytes in the PostgreSQL database: set DATABASE_URL too (the embedded database keeps them in --blob-dir)",
      );
    }
    return { kind: "postgres" };
  }
  const m = /^s3:\/\/([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:\/(.*))?$/.exec(v);
  if (m?.[1]) {
    const prefix = (m[2] ?? "").replace(/^\/+|\/+$/g, "");
    return { kind: "s3", bucket: m[1], prefix: prefix === "" ? "" : `${prefix}/` };
  }
  throw new ConfigError(
    `--blob-store must be fs, postgres or s3://bucket/prefix (a valid S3 bucket name), not ${v}`,
  );
}

function intFlag(name: string, v: string | undefined, dflt: number, min: number, max: number) {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new ConfigError(`${name} must be a whole number from ${min} to ${max}, not ${v}`);
  }
  return n;
}

const durationUnits = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;

/**
 * `30s`, `30m`, `12h`, `7d` (a whole number of up to 6 digits with a unit)
 * in milliseconds; NaN for anything else. The flags here and the CLI's
 * durations (`worker prune --lost-for`) read them alike.
 */
export function parseDuration(v: string): number {
  const m = /^(\d{1,6})([smhd])$/.exec(v);
  return m ? Number(m[1]) * durationUnits[m[2] as keyof typeof durationUnits] : Number.NaN;
}

function onOff(name: string, v: string | undefined, dflt: "on" | "off"): "on" | "off" {
  const value = v ?? dflt;
  if (value !== "on" && value !== "off") throw new ConfigError(`${name} must be on or off`);
  return value;
}

/** A whole number with a unit: `30s`, `30m`, `12h`, `7d`; `0` alone means none (at most 100 years). */
function durationFlag(name: string, v: string | undefined, dflt: number): number {
  if (v === undefined) return dflt;
  if (v === "0") return 0;
  const ms = parseDuration(v);
  if (!(ms > 0 && ms <= 36_500 * 86_400_000)) {
    throw new ConfigError(
      `${name} must be 0 or a whole number with a unit, s, m, h or d (30m, 12h, 7d), up to 36500d, not ${v}`,
    );
  }
  return ms;
}

/** Splits "host:port" or "[v6]:port"; port 0 asks the OS for a free one. */
export function splitHostPort(listen: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(listen);
  if (!m) throw new ConfigError(`--listen ${listen} is not HOST:PORT`);
  const port = Number(m[3]);
  if (port > 65535) throw new ConfigError(`--listen port ${port} is out of range`);
  return { host: m[1] ?? m[2] ?? "127.0.0.1", port };
}

export function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}
