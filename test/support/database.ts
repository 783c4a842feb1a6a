import { randomBytes } from "node:crypto";
import { type Database, openDatabase } from "../../src/db/database.js";
import { connectPostgres } from "../../src/db/postgres-client.js";

/** The PostgreSQL server the suites run against, or undefined for PGlite. */
export const postgresUrl = process.env.DATABASE_URL || undefined;
export const onPostgres = postgresUrl !== undefined;

/** A database that exists for one test file; `url` is set on PostgreSQL. */
export interface TestDatabase {
  database: Database;
  url: string | undefined;
  /** Opens another connection to the same database (a second replica, or a restart). */
  reopen(): Promise<Database>;
  drop(): Promise<void>;
}

/**
 * A fresh, migrated database: in-memory PGlite, or on PostgreSQL a new
 * database created from DATABASE_URL and dropped by `drop()`.
 */
export async function createTestDatabase(): Promise<TestDatabase> {
  if (!postgresUrl) {
    const database = await openDatabase({ dataDir: "memory://" });
    return {
      database,
      url: undefined,
      reopen: () => Promise.reject(new Error("an in-memory PGlite cannot be reopened")),
      drop: () => database.close(),
    };
  }
  const name = `meshwork_test_${randomBytes(6).toString("hex")}`;
  const admin = connectPostgres(postgresUrl, { max: 1, onnotice: () => {} });
  await admin.unsafe(`create database ${name}`);
  const url = new URL(postgresUrl);
  url.pathname = `/${name}`;
  const database = await openDatabase({ url: url.toString(), dataDir: "" });
  const opened: Database[] = [database];
  return {
    database,
    url: url.toString(),
    async reopen() {
      const again = await openDatabase({ url: url.toString(), dataDir: "" });
      opened.push(again);
      return again;
    },
    async drop() {
      for (const d of opened) await d.close().catch(() => {});
      await admin.unsafe(`drop database if exists ${name} with (force)`);
      await admin.end();
    },
  };
}
