import { PGlite, type QueryOptions, types } from "@electric-sql/pglite";
import { sql } from "drizzle-orm";
import { integer, jsonb, pgTable, text, timestamp } from "drizzle-orm/pg-core";
import { drizzle, PgliteSession } from "drizzle-orm/pglite";
import { afterEach, describe, expect, it } from "vitest";
import {
  nameStatement,
  recordNamedStatements,
  useNamedStatements,
} from "../../src/db/pglite-statements.js";

recordNamedStatements(PgliteSession);

const items = pgTable("items", {
  id: integer("id").primaryKey(),
  name: text("name").notNull(),
  doc: jsonb("doc"),
  at: timestamp("at", { withTimezone: true, mode: "date" }),
});

const schema = `
  create table items (id int primary key, name text not null, doc jsonb, at timestamptz);
  create function items_notify() returns trigger language plpgsql as $$
  begin perform pg_notify('items', new.name); return new; end $$;
  create trigger items_notify after insert on items for each row execute function items_notify();`;

const open: PGlite[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((c) => c.close()));
});

async function database(named: boolean, capacity?: number) {
  const client = await PGlite.create("memory://");
  open.push(client);
  if (named) useNamedStatements(client, capacity === undefined ? {} : { capacity });
  await client.exec(schema);
  return client;
}

/** The texts held as named statements. */
const preparedTexts = async (client: PGlite) =>
  (
    await client.query<{ statement: string }>(
      "select statement from pg_prepared_statements where name like 'meshwork_%' order by statement",
    )
  ).rows.map((r) => r.statement);

const later = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("named statements on PGlite", () => {
  it("answer as PGlite's unnamed statements do, for what Drizzle prepares by name", async () => {
    const answers = async (client: PGlite) => {
      const db = drizzle({ client });
      const insert = db
        .insert(items)
        .values({
          id: sql.placeholder("id"),
          name: sql.placeholder("name"),
          doc: sql.placeholder("doc"),
          at: sql`${sql.placeholder("at")}::timestamptz`,
        })
        .returning()
        .prepare("insert_item");
      const byName = db
        .select()
        .from(items)
        .where(sql`${items.name} = ${sql.placeholder("name")}`)
        .prepare("item_by_name");
      const out: unknown[] = [];
      for (let i = 1; i <= 4; i++) {
        out.push(
          await insert.execute({
            id: i,
            name: `n${i}`,
            doc: JSON.stringify({ i, list: [i, null, "x"] }),
            at: new Date(Date.UTC(2026, 0, i)).toISOString(),
          }),
        );
        out.push(await byName.execute({ name: `n${i}` }));
        out.push(await byName.execute({ name: "none" }));
      }
      out.push(await db.select().from(items).orderBy(items.id));
      return out;
    };
    const plain = await answers(await database(false));
    const namedClient = await database(true);
    expect(await answers(namedClient)).toEqual(plain);
    // The two statements Drizzle prepared by name, and not the select it did not.
    const texts = await preparedTexts(namedClient);
    expect(texts).toHaveLength(2);
    expect(texts.some((t) => t.startsWith("insert into"))).toBe(true);
    expect(texts.some((t) => t.includes("order by"))).toBe(false);
  });

  it("read every kind of value, row mode and count as PGlite's own query does", async () => {
    const kinds = `
      create table kinds (id int primary key, name text, big int8, ok bool, at timestamptz,
        tags text[], doc jsonb, amount numeric, raw bytea, ratio float8, uid uuid);
      insert into kinds values
        (1, 'Zoë — 日本語 🚀 ''quoted''', 9007199254740993, true, '2026-12-07 03:04:05.123456+00',
         '{a,"b c",NULL,"ü"}', '{"ü": [1, null, "x"], "n": 1.5}', 12.50, '\\x00ff', 0.25,
         '0190a8f0-0000-7000-8000-000000000001'),
        (2, '', null, false, null, '{}', 'null', null, null, null, null),
        (3, null, -1, null, 'infinity', null, '[]', 0, '\\x', -0.5, null);`;
    const statements: [string, unknown[], QueryOptions?][] = [
      ["select * from kinds where id >= $1 order by id", [1]],
      ["select * from kinds where id >= $1 order by id", [2], { rowMode: "array" }],
      // A query's own parsers over the client's, as Drizzle passes them.
      [
        "select at, big, id as same, name as same from kinds order by id",
        [],
        { parsers: { [types.TIMESTAMPTZ]: (x: string) => `at ${x}`, [types.INT8]: Number } },
      ],
      ["select id from kinds where id > $1", [99]],
      ["update kinds set ok = not ok where id <= $1 returning id, ok", [2]],
      ["update kinds set ratio = $1 where id > 1", [2]],
      ["delete from kinds where id = $1", [99]],
    ];
    const answers = async (client: PGlite) => {
      await client.exec(kinds);
      const out: unknown[] = [];
      for (const [text, params, options] of statements) {
        out.push(await client.query(text, params, options));
      }
      return out;
    };
    const plain = await answers(await database(false));
    // Texts not named run as the unnamed statement, and answer the same.
    const unnamed = await database(true);
    expect(await answers(unnamed)).toEqual(plain);
    expect(await preparedTexts(unnamed)).toEqual([]);
    const named = await database(true);
    for (const [text] of statements) nameStatement(text);
    const got = await answers(named);
    expect(got).toEqual(plain);
    // Read from named statements indeed, and the values are the rows' own.
    expect(await preparedTexts(named)).toHaveLength(statements.length - 1);
    expect((got[0] as { rows: { name: string; big: bigint }[] }).rows[0]).toMatchObject({
      name: "Zoë — 日本語 🚀 'quoted'",
      big: 9007199254740993n,
    });
  });

  it("read a text as stored, a leading U+FEFF included, where PGlite's own reader drops it", async () => {
    const bom = "\ufeff";
    const read = async (client: PGlite) => {
      await client.query("insert into items (id, name, doc) values ($1, $2, $3)", [
        1,
        `${bom}one`,
        { k: `${bom}v` },
      ]);
      const out = [
        (await client.query("select name, doc from items where id = $1", [1])).rows,
        (await client.query(`select name from items where name = '${bom}one'`)).rows,
        (await client.query("select $1::text as t", [`${bom}param`])).rows,
      ];
      await client.transaction(async (tx) => {
        out.push((await tx.query("select name from items where id = $1", [1])).rows);
      });
      return out;
    };
    const kept = [
      [{ name: `${bom}one`, doc: { k: `${bom}v` } }],
      [{ name: `${bom}one` }],
      [{ t: `${bom}param` }],
      [{ name: `${bom}one` }],
    ];
    const client = await database(true);
    expect(await read(client)).toEqual(kept);
    // Read as the unnamed statement (another test may name the insert).
    expect(await preparedTexts(client)).toEqual([]);
    // What this works around: PGlite's own query reads the same rows without it.
    const plain = await read(await database(false));
    expect(plain[0]).toEqual([{ name: "one", doc: { k: `${bom}v` } }]);
    // A COPY to PGlite's /dev/blob still answers with its bytes.
    const copied = await client.query("copy (select name from items) to '/dev/blob'");
    const bytes = Buffer.from((await copied.blob?.arrayBuffer()) ?? new ArrayBuffer(0));
    expect(bytes.toString("utf8")).toBe(`${bom}one\n`);
  });

  it("keep an error's code and leave the data as it was, for a text not named", async () => {
    const client = await database(true);
    await client.query("insert into items (id, name) values ($1, $2)", [1, "one"]);
    // Its Parse fails (a syntax error), with parameters and without.
    await expect(client.query("selec name from items where id = $1", [1])).rejects.toMatchObject({
      code: "42601",
    });
    await expect(client.query("selec 1")).rejects.toMatchObject({ code: "42601" });
    await expect(
      client.query("insert into items (id, name) values (1, 'again')"),
    ).rejects.toMatchObject({ code: "23505" });
    await expect(
      client.transaction(async (tx) => {
        await tx.query("insert into items (id, name) values ($1, $2)", [2, "two"]);
        await tx.query("insert into items (id, name) values ($1, $2)", [1, "again"]);
      }),
    ).rejects.toMatchObject({ code: "23505" });
    const rows = await client.query<{ id: number; name: string }>("select id, name from items");
    expect(rows.rows).toEqual([{ id: 1, name: "one" }]);
    expect(await preparedTexts(client)).toEqual([]);
  });

  it("keep an error's code and leave the data as it was, in and out of a transaction", async () => {
    const client = await database(true);
    const insert = "insert into items (id, name) values ($1, $2)";
    nameStatement(insert);
    for (let i = 1; i <= 3; i++) await client.query(insert, [i, `n${i}`]);
    expect(await preparedTexts(client)).toEqual([insert]);
    await expect(client.query(insert, [1, "again"])).rejects.toMatchObject({ code: "23505" });
    await expect(
      client.transaction(async (tx) => {
        await tx.query(insert, [10, "n10"]);
        await tx.query(insert, [11, "n11"]);
        await tx.query(insert, [2, "again"]);
      }),
    ).rejects.toMatchObject({ code: "23505" });
    const rows = await client.query<{ id: number }>("select id from items order by id");
    expect(rows.rows.map((r) => r.id)).toEqual([1, 2, 3]);
    // And the statement still runs.
    await client.query(insert, [4, "n4"]);
    expect((await client.query("select id from items")).rows).toHaveLength(4);
  });

  it("still deliver the notifications a statement raises", async () => {
    const client = await database(true);
    const heard: string[] = [];
    nameStatement("insert into items (id, name) values ($1, $2)");
    await client.listen("items", (payload) => heard.push(payload));
    for (let i = 1; i <= 3; i++)
      await client.query("insert into items (id, name) values ($1, $2)", [i, `n${i}`]);
    await client.transaction(async (tx) => {
      await tx.query("insert into items (id, name) values ($1, $2)", [4, "n4"]);
    });
    await later(10);
    expect(heard).toEqual(["n1", "n2", "n3", "n4"]);
    expect(await preparedTexts(client)).toHaveLength(1);
  });
  it("hand on NOTIFYs as PGlite does, to the listeners of a channel and of every channel", async () => {
    const scenario = async (named: boolean) => {
      const client = await database(named);
      const insert = "insert into items (id, name) values ($1, $2) returning id";
      const notify = "select pg_notify($1, $2)";
      if (named) for (const text of [insert, notify]) nameStatement(text);
      const heard: string[] = [];
      const stopA = await client.listen("items", (p) => heard.push(`a:${p}`));
      await client.listen('"items"', (p) => heard.push(`b:${p}`));
      // A quoted name is the channel as written; an unquoted one is folded.
      await client.listen('"MixedCase"', (p) => heard.push(`m:${p}`));
      await client.listen("OTHER", (p) => heard.push(`o:${p}`));
      const every = (channel: string, p: string) => heard.push(`*${channel}:${p}`);
      client.onNotification(every);
      let id = 0;
      const step = async (name: string) => {
        await client.query(insert, [++id, name]);
        await later(10);
      };
      await step("1");
      await stopA();
      await step("2");
      client.offNotification(every);
      await client.query(notify, ["MixedCase", "mixed"]);
      await client.query(notify, ["mixedcase", "folded"]);
      await client.query(notify, ["other", "other"]);
      await client.unlisten("items");
      await step("3");
      await client.listen("items", (p) => heard.push(`c:${p}`));
      await step("4");
      // A value its parser cannot read fails the query, and the NOTIFY of
      // the insert it committed still comes.
      const unreadable = () => {
        throw new Error("unreadable");
      };
      await expect(
        client.query(insert, [++id, "5"], { parsers: { [types.INT4]: unreadable } }),
      ).rejects.toThrow("unreadable");
      await later(10);
      expect((await client.query("select count(*)::int as n from items")).rows).toEqual([{ n: 5 }]);
      return heard;
    };
    const plain = await scenario(false);
    expect(await scenario(true)).toEqual(plain);
    // What the scenario shows, on both.
    expect(plain).toEqual(expect.arrayContaining(["a:1", "b:1", "*items:1", "b:2", "m:mixed"]));
    expect(plain).toEqual(expect.arrayContaining(["o:other", "c:4", "c:5"]));
    expect(plain).not.toEqual(expect.arrayContaining(["a:2"]));
    expect(
      plain.some((h) => h.endsWith(":3") || h === "m:folded" || h.startsWith("*items:4")),
    ).toBe(false);
  });

  it("read a column named __proto__ as a key, and a parser the client gets later", async () => {
    const answers = async (named: boolean) => {
      const client = await database(named);
      const text = "select 1 as __proto__, $1::int as n";
      if (named) nameStatement(text);
      const before = (await client.query(text, [2])).rows;
      (client.parsers as Record<number, (x: string) => unknown>)[types.INT4] = (x) => `int ${x}`;
      return [before, (await client.query(text, [3])).rows];
    };
    const plain = await answers(false);
    expect(await answers(true)).toEqual(plain);
    const row = plain[1]?.[0] as { n: unknown } | undefined;
    expect(Object.keys(row ?? {})).toEqual(["__proto__", "n"]);
    expect(row?.n).toBe("int 3");
  });

  it("keep at most `capacity` statements, the last used, and prepare an evicted one again", async () => {
    const client = await database(true, 2);
    await client.query("insert into items (id, name) values (1, 'a'), (2, 'b')");
    const texts = [
      "select name from items where id = $1",
      "select id from items where name = $1",
      "select count(*)::int as n from items where id > $1",
    ];
    for (const text of texts) nameStatement(text);
    const params = [[1], ["b"], [0]];
    const expected = [[{ name: "a" }], [{ id: 2 }], [{ n: 2 }]];
    for (let round = 0; round < 4; round++) {
      for (const [i, text] of texts.entries()) {
        expect((await client.query(text, params[i])).rows).toEqual(expected[i]);
      }
    }
    // The first text, evicted by the third, is prepared again when it runs.
    expect((await client.query(texts[0] as string, [2])).rows).toEqual([{ name: "b" }]);
    expect(await preparedTexts(client)).toEqual([texts[0], texts[2]].sort());
  });

  it("run a statement a schema change made stale again, and fail it only inside a transaction", async () => {
    const client = await database(true);
    await client.query("insert into items (id, name) values (1, 'a')");
    const text = "select * from items where id = $1";
    nameStatement(text);
    await client.query(text, [1]);
    await client.exec("alter table items add column extra int default 7");
    expect((await client.query<{ extra: number }>(text, [1])).rows[0]?.extra).toBe(7);
    await client.exec("alter table items add column more int default 8");
    await expect(client.transaction((tx) => tx.query(text, [1]))).rejects.toMatchObject({
      code: "0A000",
    });
    expect((await client.query<{ more: number }>(text, [1])).rows[0]?.more).toBe(8);
  });

  it("wait for an open transaction, and do not see what it rolls back", async () => {
    const client = await database(true);
    const count = "select count(*)::int as n from items";
    nameStatement(count);
    expect((await client.query(count)).rows).toEqual([{ n: 0 }]);
    let release = () => {};
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const open = client.transaction(async (tx) => {
      await tx.query("insert into items (id, name) values (1, 'a')");
      await held;
      throw new Error("rolled back");
    });
    await later(10);
    let answered = false;
    const counted = client.query(count).then((r) => {
      answered = true;
      return r.rows;
    });
    await later(30);
    expect(answered).toBe(false);
    release();
    await expect(open).rejects.toThrow("rolled back");
    expect(await counted).toEqual([{ n: 0 }]);
  });

  it("let a failed nested transaction roll back to its savepoint, and the outer one go on", async () => {
    const client = await database(true);
    const db = drizzle({ client });
    await db.transaction(async (tx) => {
      // Prepared on the transaction, as the stores of a transaction are.
      const insert = tx
        .insert(items)
        .values({ id: sql.placeholder("id"), name: sql.placeholder("name") })
        .prepare("insert_item");
      await insert.execute({ id: 1, name: "a" });
      const failure = await tx
        .transaction(async (inner) => {
          await inner.insert(items).values({ id: 2, name: "b" });
          await insert.execute({ id: 1, name: "again" });
        })
        .catch((error: unknown) => error);
      // Drizzle wraps the database's error.
      expect(failure).toMatchObject({ cause: { code: "23505" } });
      await insert.execute({ id: 3, name: "c" });
    });
    const rows = await db.select({ id: items.id }).from(items).orderBy(items.id);
    expect(rows).toEqual([{ id: 1 }, { id: 3 }]);
    expect(await preparedTexts(client)).toHaveLength(1);
  });
});
