import { parseArgs } from "node:util";

/** Everything `meshwork serve` can be told, from flags or the environment (README: Configuration). */
export interface Config {
  /** host:port to listen on. */
  listen: string;
  dataDir: string;
  /** PostgreSQL URL; empty = embedded PGlite in `<dataDir>/db`. */
  databaseUrl: string;
  /** Base of artifact URIs; default http://<listen>. */
  publicUrl: string;
  auth: "on" | "off";
  blobDir: string;
  logLevel: string;
  /** Seconds between worker heartbeats; a worker is LOST after 3 missed intervals. */
  heartbeatIntervalSeconds: number;
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
}

export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

const flags = {
  listen: { type: "string", env: "MESHWORK_LISTEN" },
  "data-dir": { type: "string", env: "MESHWORK_DATA_DIR" },
  "database-url": { type: "string", env: "DATABASE_URL" },
  "public-url": { type: "string", env: "MESHWORK_PUBLIC_URL" },
  auth: { type: "string", env: "MESHWORK_AUTH" },
  "blob-dir": { type: "string", env: "MESHWORK_BLOB_DIR" },
  "log-level": { type: "string", env: "MESHWORK_LOG_LEVEL" },
  "heartbeat-interval": { type: "string", env: "MESHWORK_HEARTBEAT_INTERVAL" },
  "read-max-bytes": { type: "string", env: "MESHWORK_READ_MAX_BYTES" },
  "max-artifact-bytes": { type: "string", env: "MESHWORK_MAX_ARTIFACT_BYTES" },
  "tls-cert": { type: "string", env: "MESHWORK_TLS_CERT" },
  "tls-key": { type: "string", env: "MESHWORK_TLS_KEY" },
} as const;

/** The `meshwork serve` flags, for `--help`. */
export const serveUsage = `Usage: meshwork serve [flags]

  --listen HOST:PORT        MESHWORK_LISTEN       default 127.0.0.1:8080
  --data-dir DIR            MESHWORK_DATA_DIR     default ./.meshwork
  --database-url URL        DATABASE_URL          PostgreSQL; unset = embedded PGlite
  --public-url URL          MESHWORK_PUBLIC_URL   base of artifact URIs; default http://<listen>
  --auth on|off             MESHWORK_AUTH         default off (see README: not implemented yet)
  --blob-dir DIR            MESHWORK_BLOB_DIR     default <data dir>/blobs
  --log-level LEVEL         MESHWORK_LOG_LEVEL    trace|debug|info|warn|error|silent; default info
  --heartbeat-interval S    MESHWORK_HEARTBEAT_INTERVAL  seconds, default 15
  --read-max-bytes N        MESHWORK_READ_MAX_BYTES      default 4194304
  --max-artifact-bytes N    MESHWORK_MAX_ARTIFACT_BYTES  default 1073741824
  --tls-cert FILE           MESHWORK_TLS_CERT     PEM certificate: serve TLS (ALPN h2, http/1.1)
  --tls-key FILE            MESHWORK_TLS_KEY      PEM private key of --tls-cert
`;

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
  const auth = get("auth") ?? "off";
  if (auth !== "on" && auth !== "off") throw new ConfigError("--auth must be on or off");
  if (auth === "on") {
    throw new ConfigError(
      "--auth=on is not implemented yet: bearer tokens arrive in a later release; run with --auth=off on loopback",
    );
  }
  if (!isLoopback(host)) {
    throw new ConfigError(`--auth=off is accepted only when listening on loopback, not ${host}`);
  }
  const logLevel = get("log-level") ?? "info";
  if (!["trace", "debug", "info", "warn", "error", "fatal", "silent"].includes(logLevel)) {
    throw new ConfigError(
      `--log-level ${logLevel} is not one of trace|debug|info|warn|error|silent`,
    );
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
  return {
    listen,
    dataDir,
    databaseUrl: get("database-url") ?? "",
    publicUrl,
    auth,
    blobDir: get("blob-dir") ?? `${dataDir}/blobs`,
    logLevel,
    heartbeatIntervalSeconds: intFlag(
      "--heartbeat-interval",
      get("heartbeat-interval"),
      15,
      1,
      3600,
    ),
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
  };
}

function intFlag(name: string, v: string | undefined, dflt: number, min: number, max: number) {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new ConfigError(`${name} must be a whole number from ${min} to ${max}, not ${v}`);
  }
  return n;
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
