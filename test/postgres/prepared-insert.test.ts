import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Database, openDatabase } from "../../src/db/database.js";
import { rowsOf } from "../../src/db/values.js";
import { createTaskStore } from "../../src/tasks/store.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { newTask } from "../support/fixtures.js";

// A create's insert (src/tasks/insert.ts) is a raw statement, which
// Drizzle's db.execute sends unnamed: postgres.js then parses it and asks
// for its parameters' types in a round trip of its own before every run.
// Prepared, it is parsed once per connection and runs in one round trip.
// pg_prepared_statements lists what the connection it is read on prepared
// (an unnamed statement never shows there): one connection, so that the
// read sees the creates' connection.
describe.skipIf(!onPostgres)("a create's insert on PostgreSQL", () => {
  let tdb: TestDatabase;
  let one: Database;

  beforeAll(async () => {
    tdb = await createTestDatabase();
    one = await openDatabase({ url: tdb.url ?? "", dataDir: "", poolSize: 1 });
  });
  afterAll(async () => {
    await one?.close();
    await tdb?.drop();
  });

  const insertsPrepared = async () =>
    (
      await rowsOf<{ statement: string }>(
        one.db,
        sql`select statement from pg_prepared_statements
          where statement ~ '^\\s*INSERT INTO tasks \\(' order by prepare_time`,
      )
    ).length;

  it("is prepared once per connection, one text with an idempotency key and one without", async () => {
    const tasks = createTaskStore(one.db);
    await tasks.create([newTask({ workload: "prepared" })]);
    await tasks.create([newTask({ workload: "prepared" }), newTask({ workload: "prepared" })]);
    expect(await insertsPrepared()).toBe(1);
    const keyed = newTask({ workload: "prepared", idempotencyKey: "prepared-1" });
    const [first] = await tasks.create([keyed]);
    const [again] = await tasks.create([{ ...keyed }]);
    // The keyed text still answers a repeat with the task made before.
    expect(again?.id).toBe(first?.id);
    expect(await insertsPrepared()).toBe(2);
  });

  it("still creates tasks after a column was added to tasks (a newer replica's migration)", async () => {
    const tasks = createTaskStore(one.db);
    await tasks.create([newTask({ workload: "prepared" })]);
    await tasks.create([newTask({ workload: "prepared", idempotencyKey: "prepared-2" })]);
    await rowsOf(one.db, sql`alter table tasks add column added_later int`);
    try {
      const [plain] = await tasks.create([newTask({ workload: "prepared" })]);
      const [keyed] = await tasks.create([
        newTask({ workload: "prepared", idempotencyKey: "prepared-3" }),
      ]);
      expect(plain?.workload).toBe("prepared");
      expect(keyed?.idempotencyKey).toBe("prepared-3");
    } finally {
      await rowsOf(one.db, sql`alter table tasks drop column added_later`);
    }
  });
});
