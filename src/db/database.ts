import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { PGlite } from "@electric-sql/pglite";
import { sql } from "drizzle-orm";
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core";
import { drizzle as drizzlePglite } from "drizzle-orm/pglite";
import { migrate as migratePglite } from "drizzle-orm/pglite/migrator";
import { drizzle as drizzlePostgres } from "drizzle-orm/postgres-js";
import { migrate as migratePostgres } from "drizzle-orm/postgres-js/migrator";
import postgres from "postgres";
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
  /** Subscribes to a NOTIFY channel; resolves once listening. Returns the unsubscribe. */
  listen(channel: string, onNotify: () => void): Promise<() => Promise<void>>;
  /** Throws when the database cannot answer. */
  ping(): Promise<void>;
  close(): Promise<void>;
}

export interface OpenDatabaseOptions {
  /** PostgreSQL URL; when empty, PGlite in `<dataDir>/db`. */
  url?: string | undefined;
  /** Where PGlite keeps its files; "memory://" for a throwaway in-memory database. */
  dataDir: string;
  /** Connections in the PostgreSQL pool. */
  poolSize?: number;
}

const migrationsFolder = fileURLToPath(new URL("./migrations", import.meta.url));

/** Opens the database and applies the committed migrations. */
export async function openDatabase(options: OpenDatabaseOptions): Promise<Database> {
  return options.url
    ? openPostgres(options.url, options.poolSize ?? 10)
    : openPglite(options.dataDir);
}

async function openPglite(dataDir: string): Promise<Database> {
  let location = "memory://";
  if (dataDir !== "memory://") {
    location = join(dataDir, "db");
    mkdirSync(location, { recursive: true });
  }
  const client = await PGlite.create(location);
  const db = drizzlePglite({ client, schema });
  await migratePglite(db, { migrationsFolder });
  return {
    kind: "pglite",
    db: db as unknown as Db,
    async listen(channel, onNotify) {
      const unsubscribe = await client.listen(channel, () => onNotify());
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

async function openPostgres(url: string, poolSize: number): Promise<Database> {
  const quiet = { onnotice: () => {} };
  // Migrate on one dedicated connection under an advisory lock, so that
  // replicas starting together apply each migration once.
  const admin = postgres(url, { max: 1, ...quiet });
  try {
    await admin`select pg_advisory_lock(7263550101)`;
    await migratePostgres(drizzlePostgres({ client: admin }), { migrationsFolder });
    await admin`select pg_advisory_unlock(7263550101)`;
  } finally {
    await admin.end();
  }
  const client = postgres(url, { max: poolSize, ...quiet });
  // postgres.js fetches the array types (for text[] parameters) with a
  // query of its own on every new connection. When a connection is
  // terminated during that query, its rejection reaches no caller and
  // would end the process (porsager/postgres #1192, #1205, #1223). The
  // types are kept in the client's options, shared by its connections:
  // fetch them once here, on the first connection, and never again.
  await client`select 1`;
  client.options.fetch_types = false;
  const db = drizzlePostgres({ client, schema });
  return {
    kind: "postgres",
    db: db as unknown as Db,
    async listen(channel, onNotify) {
      const sub = await client.listen(channel, () => onNotify());
      return () => sub.unlisten();
    },
    async ping() {
      await db.execute(sql`select 1`);
    },
    async close() {
      await client.end({ timeout: 5 });
    },
  };
}
