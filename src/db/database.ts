import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { sql } from "drizzle-orm";
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core";
import { applyFunctions, functionsSql } from "./functions.js";
import { createStatementEvents, observePglite, type StatementEvents } from "./observe.js";
import { initPgliteDataDir, pgliteOptions } from "./pglite-init.js";
import { createPoolGate, gatedClient, poolDefaults, ungated } from "./pool-gate.js";
import type { PostgresOptions } from "./postgres-client.js";
import { postgresPlace } from "./postgres-url.js";
import * as schema from "./schema/index.js";

/** The Drizzle handle every store takes: a database or a transaction. */
export type Db = PgDatabase<PgQueryResultHKT, typeof schema>;

/**
 * Runs `fn` with stores bound to one transaction: everything it does commits
 * together or not at all. A service names the stores it needs in its own
 * type (`WithTx<{ fleet: …; leases: … }>`), so it depends on no more.
 */
export type WithTx<S> = <T>(fn: (stores: S) => Promise<T>) => Promise<T>;

/** An open database: PGlite in-process, or a PostgreSQL pool. */
export interface Database {
  readonly kind: "pglite" | "postgres";
  readonly db: Db;
  /**
   * The sweeper's handle: on PostgreSQL a connection of its own outside the
   * request pool, so that it keeps expiring leases while requests exhaust
   * the pool; on PGlite the same handle as `db`.
   */
  readonly housekeeping: Db;
  /**
   * The handle of lease renewals, stream messages, completions and the
   * fleet's status: on PostgreSQL the request pool with connections kept
   * for it alone (pool-gate.ts, the urgent lane), so that a burst of claims
   * or reads cannot make a worker lose a lease it holds, nor hide the
   * fleet from its operator; on PGlite the same as `db`.
   */
  readonly urgent: Db;
  /**
   * The handle of vacuums and the reading of table statistics (upkeep.ts):
   * on PostgreSQL a connection of its own, without statement_timeout (a
   * vacuum of a large table may take longer), opened when first used; on
   * PGlite the same as `db`.
   */
  readonly upkeep: Db;
  /** Subscribes to a NOTIFY channel; resolves once listening. Returns the unsubscribe. */
  listen(channel: string, onNotify: (payload: string) => void): Promise<() => Promise<void>>;
  /** Throws when the database cannot answer. */
  ping(): Promise<void>;
  /** Each statement sent, for metrics and traces (observe.ts). */
  readonly statements: StatementEvents;
  /**
   * The request pool now: its size, connections in use, callers waiting
   * for one (PGlite: one connection; the rest of its statements wait).
   */
  pool(): { size: number; inUse: number; waiting: number };
  close(): Promise<void>;
}

export interface OpenDatabaseOptions {
  /** PostgreSQL URL; when empty, PGlite in `<dataDir>/db`. */
  url?: string | undefined;
  /** Where PGlite keeps its files; "memory://" for a throwaway in-memory database. */
  dataDir: string;
  /** Connections in the PostgreSQL request pool (default 10). */
  poolSize?: number;
  /**
   * How long a statement or transaction waits for a free pool connection
   * before failing with PoolExhaustedError (`unavailable`), in ms (default 3000).
   */
  acquireTimeoutMs?: number;
  /** PostgreSQL `statement_timeout` of every connection, in ms; 0 = none (default 30000). */
  statementTimeoutMs?: number;
  /** Told each step of opening as it begins ("creating the embedded database…"), for the start-up output. */
  progress?: (step: string) => void;
}

const migrationsFolder = fileURLToPath(new URL("./migrations", import.meta.url));

/**
 * Opens the database and applies the committed migrations, then the
 * database functions (functions.ts) when this version's are not installed.
 */
export async function openDatabase(options: OpenDatabaseOptions): Promise<Database> {
  const progress = options.progress ?? (() => {});
  return options.url
    ? openPostgres(options.url, { ...poolDefaults, ...withoutUndefined(options) }, progress)
    : openPglite(options.dataDir, progress);
}

function withoutUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

// Each driver is loaded only when it is the one in use: PGlite (WebAssembly)
// is not loaded on PostgreSQL, postgres.js not on PGlite (bench/RESULTS.md, Memory).
async function openPglite(dataDir: string, progress: (step: string) => void): Promise<Database> {
  progress("loading the embedded database (PGlite)");
  const [
    { PGlite },
    { drizzle: drizzlePglite, PgliteSession },
    { migrate: migratePglite },
    { recordNamedStatements, useNamedStatements },
    { compileRowMapping },
  ] = await Promise.all([
    import("@electric-sql/pglite"),
    import("drizzle-orm/pglite"),
    import("drizzle-orm/pglite/migrator"),
    import("./pglite-statements.js"),
    import("./row-mapping.js"),
  ]);
  compileRowMapping(PgliteSession);
  let location = "memory://";
  if (dataDir !== "memory://") {
    location = join(dataDir, "db");
    const fresh = !existsSync(join(location, "PG_VERSION"));
    mkdirSync(location, { recursive: true });
    if (fresh)
      progress(`creating the embedded database in ${location} (first start only, about 10 s)`);
    // A new data directory is made (initdb) in a child process: in this
    // one it would leave hundreds of MiB resident for the life of the
    // coordinator (pglite-init.ts).
    await initPgliteDataDir(location);
  }
  progress(
    `opening the embedded database${location === "memory://" ? " (in memory)" : ` in ${location}`}`,
  );
  const client = await PGlite.create(location, pgliteOptions(PGlite.defaultStartParams));
  // The statements postgres.js prepares on PostgreSQL are prepared here too
  // (pglite-statements.ts): Drizzle's PGlite driver sends them unnamed.
  recordNamedStatements(PgliteSession);
  useNamedStatements(client);
  const statements = createStatementEvents();
  const inFlight = observePglite(client, statements);
  const db = drizzlePglite({ client, schema });
  progress("applying database migrations");
  await migratePglite(db, { migrationsFolder });
  progress("applying database functions");
  await client.transaction((tx) =>
    applyFunctions({
      exec: async (text) => void (await tx.exec(text)),
      installed: async () =>
        (await tx.query<{ version: number; hash: string }>(functionsSql.installed)).rows[0],
      record: async (version, hash) => void (await tx.query(functionsSql.record(version, hash))),
    }),
  );
  return {
    kind: "pglite",
    statements,
    pool() {
      const n = inFlight();
      return { size: 1, inUse: Math.min(n, 1), waiting: Math.max(n - 1, 0) };
    },
    db: db as unknown as Db,
    // One connection, serialized by PGlite itself: there is no pool to
    // exhaust, so no gate and nothing to reserve.
    housekeeping: db as unknown as Db,
    urgent: db as unknown as Db,
    upkeep: db as unknown as Db,
    async listen(channel, onNotify) {
      const unsubscribe = await client.listen(channel, (payload) => onNotify(payload));
      return unsubscribe;
    },
    async ping() {
      await client.query("select 1");
    },
    async close() {
      await client.close();
    },
  };
}

async function openPostgres(
  url: string,
  o: typeof poolDefaults,
  progress: (step: string) => void,
): Promise<Database> {
  const [
    { connectPostgres },
    { drizzle: drizzlePostgres, PostgresJsSession },
    { migrate: migratePostgres },
    { compileRowMapping },
  ] = await Promise.all([
    import("./postgres-client.js"),
    import("drizzle-orm/postgres-js"),
    import("drizzle-orm/postgres-js/migrator"),
    import("./row-mapping.js"),
  ]);
  compileRowMapping(PostgresJsSession);
  // A URL that names a Unix socket connects through it (postgres-url.ts).
  const postgres = (options: PostgresOptions) => connectPostgres(url, options);
  // A new connection that gets no answer (its backend terminated while it
  // started up, under a storm of pg_terminate_backend) gives up after 5 s,
  // not postgres.js's 30: the statements queued on it — a batch of claims
  // among them — wait that long (faults suite: connection storm).
  const quiet = { onnotice: () => {}, connect_timeout: 5 };
  // JIT off on every connection: Meshwork's statements are short, and
  // PostgreSQL (with an LLVM provider and `jit` on, its default) compiles
  // a statement whose estimated cost passes jit_above_cost, which plans
  // steered onto indexes pass (up to PostgreSQL 17 a disabled scan is
  // costed at 10^10). Retention's two statements, which find nothing to
  // delete on most runs, were compiled with inlining and optimisation on
  // every run, once a minute: 0.9 s and 0.2 s of a core, for statements
  // that otherwise take about a millisecond.
  const noJit = { jit: "off" };
  // Migrate on one dedicated connection under an advisory lock, so that
  // replicas starting together apply each migration once, and their
  // functions one replica after the other (functions.ts).
  const admin = postgres({ max: 1, connection: noJit, ...quiet });
  progress(`connecting to PostgreSQL at ${postgresPlace(url)}`);
  try {
    await admin`select pg_advisory_lock(7263550101)`;
    progress("applying database migrations");
    await migratePostgres(drizzlePostgres({ client: admin }), { migrationsFolder });
    progress("applying database functions");
    await admin.begin((tx) =>
      applyFunctions({
        exec: async (text) => void (await tx.unsafe(text).simple()),
        installed: async () =>
          (await tx.unsafe<{ version: number; hash: string }[]>(functionsSql.installed))[0],
        record: async (version, hash) => void (await tx.unsafe(functionsSql.record(version, hash))),
      }),
    );
    await admin`select pg_advisory_unlock(7263550101)`;
  } finally {
    await admin.end();
  }
  // A stuck statement (a lock held elsewhere, a runaway plan) is cancelled
  // by the server and frees its connection; 57014 is `unavailable`.
  const connection = (name: string) => ({
    application_name: name,
    ...noJit,
    ...(o.statementTimeoutMs > 0 && { statement_timeout: o.statementTimeoutMs }),
  });
  const client = postgres({ max: o.poolSize, connection: connection("meshwork"), ...quiet });
  // Requests wait at most acquireTimeoutMs for a pool connection, then fail
  // fast with `unavailable` (pool-gate.ts): postgres.js itself would queue
  // them until a connection frees, however long that takes.
  // A quarter of the pool, at most 2, is kept for the urgent lane.
  const gate = createPoolGate(
    o.poolSize,
    o.acquireTimeoutMs,
    Math.min(2, Math.floor(o.poolSize / 4)),
  );
  const statements = createStatementEvents();
  const db = drizzlePostgres({ client: gatedClient(client, gate, statements), schema });
  const urgent = drizzlePostgres({ client: gatedClient(client, gate.urgent, statements), schema });
  // The sweeper's own connection, outside the pool and the gate: it runs
  // one statement at a time, and must keep expiring leases while request
  // traffic holds every pool connection.
  const sweeperClient = postgres({
    max: 1,
    connection: connection("meshwork-sweeper"),
    ...quiet,
  });
  const housekeeping = drizzlePostgres({
    client: gatedClient(sweeperClient, ungated, statements),
    schema,
  });
  // Vacuums run here, one at a time, for as long as they take; the
  // connection closes when idle. Its statements take no array parameters:
  // no array types to fetch.
  const upkeepClient = postgres({
    max: 1,
    idle_timeout: 60,
    fetch_types: false,
    // Explicitly none: a role's or database's default statement_timeout
    // would cancel the vacuum of a large table again and again.
    connection: { ...connection("meshwork-upkeep"), statement_timeout: 0 },
    ...quiet,
  });
  const upkeep = drizzlePostgres({
    client: gatedClient(upkeepClient, ungated, statements),
    schema,
  });
  // postgres.js fetches the array types (for text[] parameters) with a
  // query of its own on every new connection. When a connection is
  // terminated during that query, its rejection reaches no caller and
  // would end the process (porsager/postgres #1192, #1205, #1223). The
  // types are kept in each client's options, shared by its connections:
  // fetch them once here, on the first connection, and never again.
  try {
    for (const c of [client, sweeperClient]) {
      await c`select 1`;
      c.options.fetch_types = false;
    }
  } catch (error) {
    await Promise.all([
      client.end({ timeout: 1 }),
      sweeperClient.end({ timeout: 1 }),
      upkeepClient.end({ timeout: 1 }),
    ]);
    throw error;
  }
  return {
    kind: "postgres",
    statements,
    pool() {
      const { free, waiting } = gate.stats();
      return { size: o.poolSize, inUse: o.poolSize - free, waiting };
    },
    db: db as unknown as Db,
    housekeeping: housekeeping as unknown as Db,
    urgent: urgent as unknown as Db,
    upkeep: upkeep as unknown as Db,
    async listen(channel, onNotify) {
      const sub = await client.listen(channel, (payload) => onNotify(payload));
      return () => sub.unlisten();
    },
    // Through the gate on purpose: /readyz says whether a request would get
    // a connection now, and an exhausted pool is not ready.
    async ping() {
      await db.execute(sql`select 1`);
    },
    async close() {
      await Promise.all([
        client.end({ timeout: 5 }),
        sweeperClient.end({ timeout: 5 }),
        upkeepClient.end({ timeout: 5 }),
      ]);
    },
  };
}
