import { sql } from "drizzle-orm";
import { beforeAll, expect, it } from "vitest";
import type { Db } from "../../src/db/database.js";
import {
  applyFunctions,
  type FunctionsTx,
  functionsSql,
  functionsText,
  functionsVersion,
} from "../../src/db/functions.js";
import { rowsOf } from "../../src/db/values.js";
import { describeEachEngine } from "../support/engines.js";

/** applyFunctions on a database handle (the start-up runs it in a transaction; one caller here). */
function on(db: Db): FunctionsTx {
  return {
    exec: async (text) => void (await db.execute(sql.raw(text))),
    installed: async () =>
      (await rowsOf<{ version: number; hash: string }>(db, sql.raw(functionsSql.installed)))[0],
    record: async (version, hash) =>
      void (await db.execute(sql.raw(functionsSql.record(version, hash)))),
  };
}

/** Functions text of one file defining meshwork_probe(), answering `answer`. */
const probe = (answer: string, hash: string) => ({
  files: [
    {
      name: "probe.sql",
      text: `CREATE OR REPLACE FUNCTION meshwork_probe() RETURNS text LANGUAGE sql AS $$ SELECT '${answer}' $$`,
    },
  ],
  hash,
});

describeEachEngine("database functions", (db) => {
  let tx: FunctionsTx;
  const answer = async () =>
    (await rowsOf<{ a: string }>(db().db, sql`select meshwork_probe() as a`))[0]?.a;
  beforeAll(() => {
    tx = on(db().db);
  });

  it("are installed at open, recorded with this version and the hash of their files", async () => {
    expect(await tx.installed()).toEqual({ version: functionsVersion, hash: functionsText().hash });
    // Opened again (a restart, a second replica of the same release): nothing to do.
    expect(await applyFunctions(tx)).toBe("up to date");
  });

  it("are replaced by a newer version, never by an older one; the same version and hash is a no-op", async () => {
    const v = functionsVersion + 100;
    expect(await applyFunctions(tx, v, probe("new", "aa"))).toBe("applied");
    expect(await answer()).toBe("new");
    // An older replica starting beside the newer one keeps its hands off.
    expect(await applyFunctions(tx, v - 1, probe("old", "bb"))).toBe("newer installed");
    expect(await applyFunctions(tx)).toBe("newer installed");
    expect(await answer()).toBe("new");
    expect(await tx.installed()).toEqual({ version: v, hash: "aa" });
    // The same version with the same hash: nothing runs.
    expect(await applyFunctions(tx, v, probe("not run", "aa"))).toBe("up to date");
    expect(await answer()).toBe("new");
    // A newer one replaces.
    expect(await applyFunctions(tx, v + 1, probe("newer", "cc"))).toBe("applied");
    expect(await answer()).toBe("newer");
    expect(await tx.installed()).toEqual({ version: v + 1, hash: "cc" });
  });
});
