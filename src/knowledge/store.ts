import { randomUUID } from "node:crypto";
import { and, asc, eq, gt, sql } from "drizzle-orm";
import { DomainError } from "../core/errors.js";
import { keysetAfter, type Position } from "../core/paging.js";
import type { Db } from "../db/database.js";
import { coordinatorMeta, type KnowledgeRow, knowledgeEntries } from "../db/schema/index.js";
import { asBoolean, rowsOf } from "../db/values.js";

export interface ImportCounts {
  inserted: number;
  updated: number;
  unchanged: number;
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
          throw new DomainError(
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
        throw new DomainError("not_found", "NOT_FOUND", `knowledge entry ${kind}/${key} not found`);
      return row;
    },

    async remove(kind: string, key: string): Promise<void> {
      const rows = await db
        .delete(k)
        .where(and(eq(k.kind, kind), eq(k.key, key)))
        .returning({ key: k.key });
      if (rows.length === 0) {
        throw new DomainError("not_found", "NOT_FOUND", `knowledge entry ${kind}/${key} not found`);
      }
    },

    /** Entries in (updated_at, kind, key) order after `after`, optionally of one kind or newer than `since`. */
    async page(
      filter: { kind?: string | undefined; since?: Date | undefined },
      size: number,
      after: Position | undefined,
    ): Promise<KnowledgeRow[]> {
      return db
        .select()
        .from(k)
        .where(
          and(
            filter.kind ? eq(k.kind, filter.kind) : undefined,
            filter.since ? gt(k.updatedAt, filter.since) : undefined,
            keysetAfter([k.updatedAt, k.kind, k.key], after, "asc"),
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
      const list = await rowsOf<{ inserted: unknown }>(
        db,
        sql`
        insert into knowledge_entries as k (kind, key, value, version, updated_at, origin)
        select v.kind, v.key, v.value, v.version, v."updatedAt", v.origin
        from jsonb_to_recordset(${json}::jsonb)
          as v(kind text, key text, value jsonb, version bigint, "updatedAt" timestamptz, origin text)
        on conflict (kind, key) do update
          set value = excluded.value, version = excluded.version,
              updated_at = excluded.updated_at, origin = excluded.origin
          where (excluded.version, excluded.updated_at, excluded.origin) > (k.version, k.updated_at, k.origin)
        returning (xmax = 0) as inserted`,
      );
      const inserted = list.filter((r) => asBoolean(r.inserted)).length;
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
