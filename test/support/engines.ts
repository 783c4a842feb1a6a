import { afterAll, beforeAll, describe } from "vitest";
import { type Database, openDatabase } from "../../src/db/database.js";
import { createTestDatabase, postgresUrl } from "./database.js";

/** A database engine a store contract suite runs on. */
export interface Engine {
  name: "pglite" | "postgres";
  /** A fresh, migrated database of this engine, and how to drop it. */
  open(): Promise<{ database: Database; drop(): Promise<void> }>;
}

const pglite: Engine = {
  name: "pglite",
  async open() {
    const database = await openDatabase({ dataDir: "memory://" });
    return { database, drop: () => database.close() };
  },
};

/** A fresh database on the PostgreSQL server of DATABASE_URL (createTestDatabase). */
const postgresEngine: Engine = { name: "postgres", open: () => createTestDatabase() };

/** Every engine available in this run: PGlite always, PostgreSQL when DATABASE_URL is set. */
export const engines: Engine[] = postgresUrl ? [pglite, postgresEngine] : [pglite];

/**
 * Runs a store contract suite once per engine (`describe.each`), each on its
 * own fresh database. `suite` registers its tests; `db()` is the database of
 * the engine being run, available from `beforeAll` on.
 */
export function describeEachEngine(
  title: string,
  suite: (db: () => Database, engine: Engine) => void,
): void {
  describe.each(engines)(`${title} on $name`, (engine) => {
    let opened: { database: Database; drop(): Promise<void> } | undefined;
    beforeAll(async () => {
      opened = await engine.open();
    });
    afterAll(async () => {
      await opened?.drop();
    });
    suite(() => {
      if (!opened) throw new Error("the database opens in beforeAll");
      return opened.database;
    }, engine);
  });
}
