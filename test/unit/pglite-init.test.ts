import { existsSync, mkdirSync, mkdtempSync, readdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { openDatabase } from "../../src/db/database.js";
import { initPgliteDataDir, pgliteSharedBuffers } from "../../src/db/pglite-init.js";
import { onPostgres } from "../support/database.js";

/**
 * A new embedded database is made (initdb) in a child process, then opened
 * in this one like an existing one (bench/RESULTS.md, Memory). It needs no
 * server: this runs once, in the PGlite run.
 */
describe.skipIf(onPostgres)("PGlite data directory", () => {
  it("is made by a child process, opened with the small buffer pool, and keeps its rows", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "meshwork-pglite-init-"));
    const first = await openDatabase({ dataDir });
    try {
      expect(existsSync(join(dataDir, "db", "PG_VERSION"))).toBe(true);
      const shown = await first.db.execute(sql`show shared_buffers`);
      expect(JSON.stringify(shown)).toContain(pgliteSharedBuffers);
      await first.db.execute(sql`create table kept (n int)`);
      await first.db.execute(sql`insert into kept values (7)`);
    } finally {
      await first.close();
    }
    const again = await openDatabase({ dataDir });
    try {
      const rows = await again.db.execute(sql`select n from kept`);
      expect(JSON.stringify(rows)).toContain("7");
    } finally {
      await again.close();
    }
  });

  it("makes it whole or not at all: a half-made one left by a killed child is removed, never opened", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "meshwork-pglite-init-"));
    // What a child killed midway leaves: initdb writes PG_VERSION early.
    mkdirSync(join(dataDir, "db.init-99999"));
    writeFileSync(join(dataDir, "db.init-99999", "PG_VERSION"), "17\n");
    const db = await openDatabase({ dataDir });
    try {
      expect(existsSync(join(dataDir, "db.init-99999"))).toBe(false);
      expect(readdirSync(dataDir).filter((n) => n.startsWith("db.init-"))).toEqual([]);
      const rows = await db.db.execute(sql`select count(*) as n from tasks`);
      expect(JSON.stringify(rows)).toContain("0");
    } finally {
      await db.close();
    }
  });

  it("leaves an existing data directory alone", async () => {
    const location = mkdtempSync(join(tmpdir(), "meshwork-pglite-init-"));
    writeFileSync(join(location, "PG_VERSION"), "17\n");
    await initPgliteDataDir(location); // would fail on a directory that is not empty
  });

  it("says in one line why initdb failed", async () => {
    const file = join(mkdtempSync(join(tmpdir(), "meshwork-pglite-init-")), "file");
    writeFileSync(file, "");
    const error = await initPgliteDataDir(file).then(
      () => undefined,
      (e: Error) => e,
    );
    expect(error?.message).toMatch(/^initdb failed: \S/);
    expect(error?.message).not.toContain("\n");
  });
});
