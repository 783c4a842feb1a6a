import type postgres from "postgres";
import { afterAll, beforeAll } from "vitest";
import { connectPostgres } from "../../src/db/postgres-client.js";
import { createTestDatabase, type TestDatabase } from "./database.js";

/**
 * A one-connection client to `url` whose notices land in `plans`: once
 * `explainEverything` has run on it, that is every plan auto_explain logs.
 */
export function noticeClient(url: string, plans: string[]): postgres.Sql {
  return connectPostgres(url, {
    max: 1,
    onnotice: (n) => {
      if (typeof n.message === "string") plans.push(n.message);
    },
  });
}

/**
 * From now on, the plan of every statement on this connection is sent to it
 * as a notice (auto_explain): with `nested`, the statements inside functions
 * too; with `analyze`, the actual rows (and, with `timing`, times).
 */
export async function explainEverything(
  sql: postgres.Sql,
  options: { nested?: boolean; analyze?: boolean; timing?: boolean } = {},
): Promise<void> {
  await sql`load 'auto_explain'`;
  await sql`set auto_explain.log_min_duration = 0`;
  if (options.nested) await sql`set auto_explain.log_nested_statements = on`;
  if (options.analyze) await sql`set auto_explain.log_analyze = on`;
  if (options.timing === false) await sql`set auto_explain.log_timing = off`;
  await sql`set client_min_messages = log`;
}

/** A database of one describe block, for reading its statements' plans. */
export interface PlanDatabase {
  /** The database (once the block's first beforeAll has run). */
  readonly tdb: TestDatabase;
  /** A one-connection client on it whose notices land in the block's `plans` (noticeClient). */
  readonly sql: postgres.Sql;
  /** Another one-connection client on it, its notices dropped; ended with the block. */
  client(): postgres.Sql;
}

/**
 * A fresh database for the describe block this is called in: made before
 * its tests (a beforeAll registered here, so ahead of the block's own) and,
 * with every client on it, ended and dropped after them.
 */
export function planDatabase(plans: string[] = []): PlanDatabase {
  let tdb: TestDatabase | undefined;
  let sql: postgres.Sql | undefined;
  const clients: postgres.Sql[] = [];
  beforeAll(async () => {
    tdb = await createTestDatabase();
    sql = noticeClient(tdb.url ?? "", plans);
  });
  afterAll(async () => {
    for (const c of clients) await c.end();
    await sql?.end();
    await tdb?.drop();
  });
  const made = <T>(value: T | undefined): T => {
    if (value === undefined) throw new Error("the plan database is made in the block's beforeAll");
    return value;
  };
  return {
    get tdb() {
      return made(tdb);
    },
    get sql() {
      return made(sql);
    },
    client() {
      const c = noticeClient(made(tdb).url ?? "", []);
      clients.push(c);
      return c;
    },
  };
}
