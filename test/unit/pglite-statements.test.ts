import { PGlite } from "@electric-sql/pglite";
import { sql } from "drizzle-orm";
import { integer, jsonb, pgTable, text, timestamp } from "drizzle-orm/pg-core";
import { drizzle } from "drizzle-orm/pglite";
import { afterEach, describe, expect, it } from "vitest";
import { useNamedStatements } from "../../src/db/pglite-statements.js";

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

const preparedNames = async (client: PGlite) =>
  (
    await client.query<{ name: string }>(
      "select name from pg_prepared_statements where name like 'meshwork_%' order by name",
    )
  ).rows.map((r) => r.name);

describe("named statements on PGlite", () => {
  it("answer as PGlite's unnamed statements do, through Drizzle, run after run", async () => {
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
    // The two texts that ran more than once are held as named statements.
    expect(await preparedNames(namedClient)).toHaveLength(2);
  });

  it("keep an error's code and leave the data as it was, in and out of a transaction", async () => {
    const client = await database(true);
    const insert = "insert into items (id, name) values ($1, $2)";
    for (let i = 1; i <= 3; i++) await client.query(insert, [i, `n${i}`]);
    expect(await preparedNames(client)).toHaveLength(1);
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
    await client.listen("items", (payload) => heard.push(payload));
    for (let i = 1; i <= 3; i++)
      await client.query("insert into items (id, name) values ($1, $2)", [i, `n${i}`]);
    await client.transaction(async (tx) => {
      await tx.query("insert into items (id, name) values ($1, $2)", [4, "n4"]);
    });
    await new Promise((r) => setTimeout(r, 10));
    expect(heard).toEqual(["n1", "n2", "n3", "n4"]);
  });

  it("keep at most `capacity` statements, and run an evicted text again", async () => {
    const client = await database(true, 2);
    await client.query("insert into items (id, name) values (1, 'a'), (2, 'b')");
    const texts = [
      "select name from items where id = $1",
      "select id from items where name = $1",
      "select count(*)::int as n from items where id > $1",
    ];
    const params = [[1], ["b"], [0]];
    const expected = [[{ name: "a" }], [{ id: 2 }], [{ n: 2 }]];
    for (let round = 0; round < 3; round++) {
      for (const [i, text] of texts.entries()) {
        expect((await client.query(text, params[i])).rows).toEqual(expected[i]);
      }
    }
    expect((await preparedNames(client)).length).toBeLessThanOrEqual(2);
  });

  it("fail once when a schema change alters a statement's columns, then answer the new ones", async () => {
    const client = await database(true);
    await client.query("insert into items (id, name) values (1, 'a')");
    const text = "select * from items where id = $1";
    await client.query(text, [1]);
    await client.query(text, [1]);
    await client.exec("alter table items add column extra int default 7");
    await expect(client.query(text, [1])).rejects.toMatchObject({ code: "0A000" });
    expect((await client.query<{ extra: number }>(text, [1])).rows[0]?.extra).toBe(7);
  });
});
