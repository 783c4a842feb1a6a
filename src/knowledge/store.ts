import { randomUUID } from "node:crypto";
import { and, asc, eq, gt, or, sql } from "drizzle-orm";
import { type Db, rowsOf } from "../db/database.js";
import { StoreError } from "../db/errors.js";
import { coordinatorMeta, type KnowledgeRow, knowledgeEntries } from "../db/schema/index.js";

export interface ImportCounts {
  inserted: number;
  updated: number;
  unchanged: number;
}

/** A position in (updated_at, kind, key) order, for listing and export. */
export interface KnowledgeCursor {
  at: Date;
  kind: string;
  key: string;
}

/** Knowledge entries and this coordinator's stable origin id. */
export function createKnowledgeStore(db: Db) {
  let origin: string | undefined;
  const k = knowledgeEntries;

  return {
    /** This coordinator's id, made once and kept in its database. */
    async origin(): Promise<string> {
      if (origin) return origin;
      await db
        .insert(coordinatorMeta)
        .values({ key: "origin", value: randomUUID() })
        .onConflictDoNothing();
      const [row] = await db
        .select()
        .from(coordinatorMeta)
        .where(eq(coordinatorMeta.key, "origin"));
      origin = row?.value ?? "";
      return origin;
    },

    /**
     * Writes an entry made here. Version 0 means one more than the stored
     * one; an explicit version must be greater than the stored one.
     */
    async put(
      kind: string,
      key: string,
      value: Record<string, unknown>,
      version: number,
    ): Promise<KnowledgeRow> {
      const me = await this.origin();
      return db.transaction(async (tx) => {
        const [stored] = await tx
          .select()
          .from(k)
          .where(and(eq(k.kind, kind), eq(k.key, key)))
          .for("update");
        const next = version === 0 ? (stored?.version ?? 0) + 1 : version;
        if (stored && next <= stored.version) {
          throw new StoreError(
            "aborted",
            "VERSION_CONFLICT",
            `version ${next} is not newer than the stored version ${stored.version} of ${kind}/${key}`,
          );
        }
        const [row] = await tx
          .insert(k)
          .values({ kind, key, value, version: next, updatedAt: sql`now()`, origin: me })
          .onConflictDoUpdate({
            target: [k.kind, k.key],
            set: { value, version: next, updatedAt: sql`now()`, origin: me },
          })
          .returning();
        if (!row) throw new Error("knowledge upsert returned nothing");
        return row;
      });
    },

    async get(kind: string, key: string): Promise<KnowledgeRow> {
      const [row] = await db
        .select()
        .from(k)
        .where(and(eq(k.kind, kind), eq(k.key, key)));
      if (!row)
        throw new StoreError("not_found", "NOT_FOUND", `knowledge entry ${kind}/${key} not found`);
      return row;
    },

    async remove(kind: string, key: string): Promise<void> {
      const rows = await db
        .delete(k)
        .where(and(eq(k.kind, kind), eq(k.key, key)))
        .returning({ key: k.key });
      if (rows.length === 0) {
        throw new StoreError("not_found", "NOT_FOUND", `knowledge entry ${kind}/${key} not found`);
      }
    },

    /** Entries in (updated_at, kind, key) order after `after`, optionally of one kind or newer than `since`. */
    async page(
      filter: { kind?: string | undefined; since?: Date | undefined },
      size: number,
      after: KnowledgeCursor | undefined,
    ): Promise<KnowledgeRow[]> {
      return db
        .select()
        .from(k)
        .where(
          and(
            filter.kind ? eq(k.kind, filter.kind) : undefined,
            filter.since ? gt(k.updatedAt, filter.since) : undefined,
            after
              ? or(
                  gt(k.updatedAt, after.at),
                  and(eq(k.updatedAt, after.at), gt(k.kind, after.kind)),
                  and(eq(k.updatedAt, after.at), eq(k.kind, after.kind), gt(k.key, after.key)),
                )
              : undefined,
          ),
        )
        .orderBy(asc(k.updatedAt), asc(k.kind), asc(k.key))
        .limit(size);
    },

    /**
     * Merges entries in one statement: an entry replaces the stored one only
     * if (version, updated_at, origin) is greater, so importing the same
     * export twice changes nothing.
     */
    async merge(entries: KnowledgeRow[]): Promise<ImportCounts> {
      if (entries.length === 0) return { inserted: 0, updated: 0, unchanged: 0 };
      // One row per entry in a statement: of duplicates, the winner by the same rule.
      const best = new Map<string, KnowledgeRow>();
      for (const e of entries) {
        const id = JSON.stringify([e.kind, e.key]);
        const held = best.get(id);
        if (!held || wins(e, held)) best.set(id, e);
      }
      const json = JSON.stringify(
        [...best.values()].map((e) => ({ ...e, updatedAt: e.updatedAt.toISOString() })),
      );
      const rows = await db.execute(sql`
        insert into knowledge_entries as k (kind, key, value, version, updated_at, origin)
        select v.kind, v.key, v.value, v.version, v."updatedAt", v.origin
        from jsonb_to_recordset(${json}::jsonb)
          as v(kind text, key text, value jsonb, version bigint, "updatedAt" timestamptz, origin text)
        on conflict (kind, key) do update
          set value = excluded.value, version = excluded.version,
              updated_at = excluded.updated_at, origin = excluded.origin
          where (excluded.version, excluded.updated_at, excluded.origin) > (k.version, k.updated_at, k.origin)
        returning (xmax = 0) as inserted`);
      const list = rowsOf<{ inserted: boolean | string }>(rows);
      const inserted = list.filter((r) => r.inserted === true || r.inserted === "t").length;
      const updated = list.length - inserted;
      return { inserted, updated, unchanged: entries.length - list.length };
    },
  };
}

/** The merge rule: higher version, then later updated_at, then greater origin. */
export function wins(a: KnowledgeRow, b: KnowledgeRow): boolean {
  if (a.version !== b.version) return a.version > b.version;
  if (a.updatedAt.getTime() !== b.updatedAt.getTime()) return a.updatedAt > b.updatedAt;
  return a.origin > b.origin;
}

export type KnowledgeStore = ReturnType<typeof createKnowledgeStore>;
