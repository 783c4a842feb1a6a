import { PGlite } from "@electric-sql/pglite";
import { eq, sql } from "drizzle-orm";
import {
  bigint,
  boolean,
  integer,
  jsonb,
  numeric,
  pgTable,
  text,
  timestamp,
} from "drizzle-orm/pg-core";
import { drizzle, PgliteSession } from "drizzle-orm/pglite";
import { drizzle as drizzlePostgres, PostgresJsSession } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compileRowMapping } from "../../src/db/row-mapping.js";

const items = pgTable("items", {
  id: integer("id").primaryKey(),
  name: text("name"),
  big: bigint("big", { mode: "bigint" }),
  at: timestamp("at", { withTimezone: true, mode: "date" }),
  atText: timestamp("at_text", { withTimezone: true, mode: "string" }),
  doc: jsonb("doc"),
  tags: text("tags").array(),
  amount: numeric("amount"),
  flag: boolean("flag"),
});
const notes = pgTable("notes", {
  id: integer("id").primaryKey(),
  itemId: integer("item_id"),
  body: text("body").notNull(),
});

// A session class of its own, so that the same queries run both ways in one process.
const CompiledSession = class extends (PgliteSession as new (...args: never[]) => object) {};
compileRowMapping(CompiledSession);

let client: PGlite;
let plain: ReturnType<typeof drizzle>;
let compiled: ReturnType<typeof drizzle>;

beforeAll(async () => {
  client = await PGlite.create("memory://");
  await client.exec(`
    create table items (id int primary key, name text, big int8, at timestamptz, at_text timestamptz,
      doc jsonb, tags text[], amount numeric, flag bool);
    create table notes (id int primary key, item_id int, body text not null);
    insert into items values
      (1, 'Zoë', 9007199254740993, '2026-12-07 04:05:06.789+00', '2026-12-07 04:05:06.789+00',
       '{"a": [1, null]}', '{x,"y z"}', 12.50, true),
      (2, null, null, null, null, null, null, null, null);
    insert into notes values (10, 1, 'first');`);
  plain = drizzle({ client });
  compiled = drizzle({ client });
  Object.setPrototypeOf(
    (compiled as unknown as { _: { session: object } })._.session,
    CompiledSession.prototype,
  );
});
afterAll(async () => {
  await client.close();
});

/** Each query, built on a database, as the stores build theirs. */
const queries = (db: ReturnType<typeof drizzle>) => ({
  table: db.select().from(items).orderBy(items.id).prepare("q_table"),
  partial: db
    .select({
      id: items.id,
      count: sql`count(*) over ()`.mapWith(Number),
      raw: sql`'{1,2}'::int[]`,
      when: sql<Date>`${items.at}`.mapWith(items.at),
      aliased: sql<string>`upper(${items.name})`.as("upper_name"),
    })
    .from(items)
    .orderBy(items.id)
    .prepare("q_partial"),
  returning: db
    .update(items)
    .set({ flag: sql`not ${items.flag}` })
    .where(eq(items.id, sql.placeholder("id")))
    .returning()
    .prepare("q_returning"),
  // A join's tables are nested objects: Drizzle's own mapping, which nulls
  // the object of a left-joined table that matched nothing.
  joined: db
    .select()
    .from(items)
    .leftJoin(notes, eq(notes.itemId, items.id))
    .orderBy(items.id)
    .prepare("q_joined"),
  nested: db
    .select({ id: items.id, inner: { name: items.name, at: items.at } })
    .from(items)
    .orderBy(items.id)
    .prepare("q_nested"),
});

describe("rows of a flat selection, mapped by a mapper made once", () => {
  it("come out as Drizzle's own mapping gives them, whatever the column types", async () => {
    const a = queries(plain);
    const b = queries(compiled);
    for (const name of ["table", "partial", "joined", "nested"] as const) {
      expect(await b[name].execute(), name).toEqual(await a[name].execute());
    }
    expect(await b.returning.execute({ id: 1 })).toEqual(
      (await a.returning.execute({ id: 1 })).map((r) => ({ ...r, flag: !r.flag })),
    );
    const [first, second] = await b.table.execute();
    expect(first).toMatchObject({
      name: "Zoë",
      big: 9007199254740993n,
      at: new Date("2026-12-07T04:05:06.789Z"),
      doc: { a: [1, null] },
      tags: ["x", "y z"],
    });
    expect(second).toMatchObject({ name: null, big: null, at: null, doc: null, tags: null });
    const [withNote, withoutNote] = await b.joined.execute();
    expect(withNote?.notes).toMatchObject({ body: "first" });
    expect(withoutNote?.notes).toBeNull();
  });

  it("are mapped by the made mapper for a flat selection only", () => {
    const made = (q: object) =>
      typeof (q as { customResultMapper?: unknown }).customResultMapper === "function";
    const b = queries(compiled);
    expect(made(b.table)).toBe(true);
    expect(made(b.partial)).toBe(true);
    expect(made(b.returning)).toBe(true);
    expect(made(b.joined)).toBe(false);
    expect(made(b.nested)).toBe(false);
    expect(made(queries(plain).table)).toBe(false);
  });

  it("are made on the postgres.js session too", async () => {
    const Compiled = class extends (PostgresJsSession as new (...args: never[]) => object) {};
    compileRowMapping(Compiled);
    // Preparing a query sends nothing: this client never connects.
    const sql = postgres("postgres://nobody@127.0.0.1:9/none", { max: 1 });
    const db = drizzlePostgres(sql);
    Object.setPrototypeOf(
      (db as unknown as { _: { session: object } })._.session,
      Compiled.prototype,
    );
    const mapper = (q: object) =>
      (q as { customResultMapper?: (rows: unknown[][]) => unknown[] }).customResultMapper;
    const flat = mapper(db.select().from(notes).prepare("pg_flat"));
    expect(flat?.([[1, null, "body"]])).toEqual([{ id: 1, itemId: null, body: "body" }]);
    expect(
      mapper(
        db
          .select({ inner: { id: notes.id } })
          .from(notes)
          .prepare("pg_nested"),
      ),
    ).toBe(undefined);
    await sql.end();
  });
});
