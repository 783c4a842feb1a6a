import { chmodSync, mkdirSync, writeFileSync } from "node:fs";
import { createApp } from "./app.js";
import { loadS3Module } from "./artifacts/blob-stores.js";
import { createTokenStore } from "./auth/token-store.js";
import { adminTokenPath, type Config, ConfigError, shownUrl } from "./config.js";
import { isSharePath } from "./core/scheduling.js";
import { lockDataDir, StartupError } from "./data-dir-lock.js";
import { type Database, openDatabase } from "./db/database.js";
import { postgresPlace } from "./db/postgres-url.js";
import { type KedaListener, listenKeda } from "./http/keda-listener.js";
import { createLogger, type Logger } from "./log.js";
import { type BoundListener, bind, kedaHandler, type RunningServer } from "./server.js";
import { readySummary, wantsPrettyLogs } from "./startup.js";
import { loadTracing } from "./tracing/load.js";
import type { Tracing } from "./tracing/tracing.js";

/**
 * Log lines for a person (pino-pretty, loaded only then): time, level and
 * message first, the fields after; colours only on a terminal.
 */
async function prettyDestination(colorize: boolean) {
  const { build: pretty } = await import("pino-pretty");
  return pretty({
    colorize,
    sync: true,
    translateTime: "SYS:HH:MM:ss",
    ignore: "pid,hostname,service",
    singleLine: true,
  });
}

/**
 * On first start, with no token at all, makes an admin token and writes it
 * to `<data dir>/admin.token` (mode 0600); the log says where, never what.
 */
async function firstAdminToken(database: Database, config: Config, log: Logger): Promise<void> {
  const path = adminTokenPath(config.dataDir);
  const created = await createTokenStore(database.db).createFirstAdmin((secret) => {
    mkdirSync(config.dataDir, { recursive: true });
    writeFileSync(path, `${secret}\n`, { mode: 0o600 });
    chmodSync(path, 0o600); // an existing file keeps its mode on write
  });
  if (!created) return;
  log.info({ path }, "created the first admin token; it is in this file (meshwork token --help)");
}

/**
 * Why the database could not be opened, in one line that says what to do,
 * without the URL (it may hold a password) or a stack.
 */
function whyNoDatabase(error: unknown, config: Config): string {
  const e = error as { code?: string; message?: string };
  const first = (e.message ?? String(error)).split("\n")[0];
  if (!config.databaseUrl) {
    return `cannot open the embedded database in ${config.dataDir}/db: ${first}; check that the data directory is readable and writable`;
  }
  // postgresPlace says "the server in DATABASE_URL" for a URL it cannot read.
  const where = `PostgreSQL at ${postgresPlace(config.databaseUrl)}`;
  switch (e.code) {
    case "3D000":
      return `${where}: ${first}: create it (createdb), or fix the database name in DATABASE_URL`;
    case "28000":
    case "28P01":
      return `${where} refused the login (${first}): check the user and password in DATABASE_URL`;
    case "ECONNREFUSED":
      return `cannot reach ${where} (connection refused): is it running, on that port?`;
    case "ENOENT":
      // A Unix socket that is not there.
      return `cannot reach ${where}: no socket there; is it running, and is that its socket directory and port?`;
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return `cannot resolve the host of ${where}: check DATABASE_URL`;
    default:
      return `cannot open ${where}: ${first}`;
  }
}

/**
 * `meshwork serve`: open the database, migrate, listen, and shut down
 * cleanly on SIGTERM/SIGINT (stop accepting, let in-flight RPCs finish
 * within the grace period, end streams, close the database, exit 0).
 */
export async function serve(config: Config): Promise<void> {
  if (config.defaultShare !== "" && !isSharePath(config.defaultShare)) {
    throw new ConfigError(
      `--default-share must be token (the creating token's name) or a share path such as lab/team-a, not ${config.defaultShare}`,
    );
  }
  const pretty = wantsPrettyLogs(config, process.stdout.isTTY === true);
  const log = pretty
    ? createLogger(config.logLevel, await prettyDestination(process.stdout.isTTY === true))
    : createLogger(config.logLevel);
  // The last resort: a promise a library rejected with nothing listening
  // (postgres.js has done so while reconnecting) is logged, and the
  // coordinator keeps serving. Ending the process would drop every call in
  // flight for an error that concerned none of them. Database errors are
  // handled where they start; this is for what slips past.
  process.on("unhandledRejection", (reason) => {
    log.error({ err: reason }, "unhandled rejection (kept serving)");
  });
  // postgres.js 3.4.9 can write to a connection that has just closed, from
  // a setImmediate, and throw where nothing can catch it (porsager/postgres
  // #1208). bin/postinstall.js guards that write at install; where it could
  // not, that one error is logged and the coordinator keeps serving (the
  // connection's queries fail and it reconnects). Any other uncaught
  // exception still ends the process, as Node would.
  process.on("uncaughtException", (error) => {
    if (
      error instanceof TypeError &&
      error.message.includes("reading 'write'") &&
      /postgres[\\/](cjs[\\/])?src[\\/]connection\.js/.test(error.stack ?? "")
    ) {
      log.error({ err: error }, "postgres.js wrote to a closed connection (kept serving)");
      return;
    }
    log.fatal({ err: error }, "uncaught exception");
    process.exit(1);
  });
  // In this order: nothing in the data directory is touched before this
  // process holds its lock and has bound its port.
  const unlock = lockDataDir(config.dataDir);
  let bound: BoundListener | undefined;
  let database: Database | undefined;
  let tracing: Tracing | undefined;
  let server: RunningServer;
  let keda: KedaListener | undefined;
  try {
    bound = await bind(config, config.listen);
    // OpenTelemetry is loaded only with an endpoint (tracing/load.ts).
    tracing = await loadTracing(config.otelEndpoint);
    // An S3 bucket that cannot be used is said now, not at the first upload.
    const s3 = await loadS3Module(config);
    if (s3 && config.blobStore.kind === "s3") await s3.checkS3Bucket(config.blobStore.bucket);
    database = await openDatabase({
      progress: (step) => log.info(step),
      url: config.databaseUrl,
      dataDir: config.dataDir,
      poolSize: config.dbPoolSize,
      acquireTimeoutMs: config.dbAcquireTimeoutMs,
      statementTimeoutMs: config.dbStatementTimeoutMs,
    }).catch((error: unknown) => {
      throw new StartupError(whyNoDatabase(error, config));
    });
    if (config.auth === "on") await firstAdminToken(database, config, log);
    const app = createApp(database, config, log, s3, tracing);
    server = await bound.serve(app);
    if (config.kedaListen) {
      keda = await listenKeda(kedaHandler(app), {
        listen: config.kedaListen,
        tlsCert: config.tlsCert,
        tlsKey: config.tlsKey,
        clientCa: config.kedaClientCa,
      });
      log.info(
        { url: keda.url, client_certificates: config.kedaClientCa !== "" },
        "KEDA external scaler listening",
      );
    }
  } catch (error) {
    await keda?.close().catch(() => {});
    await bound?.close().catch(() => {});
    await database?.close().catch(() => {});
    await tracing?.shutdown().catch(() => {});
    unlock();
    throw error;
  }
  const db = database;
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, "shutting down");
    try {
      await keda?.close();
      await server.close();
      await db.close();
      // The spans of the last requests and statements are sent before exit.
      await tracing?.shutdown().catch((error: unknown) => {
        log.warn({ err: error }, "exporting the last spans failed");
      });
      unlock();
      log.info("stopped");
      process.exit(0);
    } catch (error) {
      log.error({ err: error }, "shutdown failed");
      process.exit(1);
    }
  };
  // Handled before the "listening" line: a supervisor may signal as soon as it sees it.
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));
  if (pretty && log.isLevelEnabled("info")) {
    process.stdout.write(readySummary(config, server.url));
  } else {
    log.info(
      {
        url: server.url,
        database: db.kind === "pglite" ? `pglite:${config.dataDir}/db` : "postgres",
        auth: config.auth,
        ...(tracing && { otel_endpoint: shownUrl(config.otelEndpoint) }),
      },
      "meshwork listening",
    );
  }
  const publicHost = new URL(config.publicUrl).hostname;
  if (["0.0.0.0", "[::]", "::"].includes(publicHost) || new URL(config.publicUrl).port === "0") {
    log.warn(
      { public_url: config.publicUrl },
      "artifact URIs are built from --public-url, which names no address a worker can reach: set --public-url (e.g. http://coordinator.lan:8080)",
    );
  }
}
