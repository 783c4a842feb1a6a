import { create, type JsonObject } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  type ImportRejection,
  ImportRejectionSchema,
  type KnowledgeEntry,
  KnowledgeEntrySchema,
  type KnowledgeService,
} from "../../gen/meshwork/v1/knowledge_pb.js";
import { DomainError, invalid } from "../core/errors.js";
import { decodePageToken, type Position, pageOf, pageSize } from "../core/paging.js";
import { isStorableTime, shallowJson, text, timeField } from "../core/validate.js";
import type { KnowledgeRow } from "../db/schema/index.js";
import type { KnowledgeStore } from "./store.js";

const exportPage = 500;

/** Entries are listed and exported in (updated_at, kind, key) order. */
const positionOf = (e: KnowledgeRow): Position => ({ at: e.updatedAt, keys: [e.kind, e.key] });

export function toEntry(row: KnowledgeRow): KnowledgeEntry {
  return create(KnowledgeEntrySchema, {
    kind: row.kind,
    key: row.key,
    value: row.value as JsonObject,
    version: BigInt(row.version),
    updatedAt: timestampFromDate(row.updatedAt),
    origin: row.origin,
  });
}

/**
 * An imported entry checked field by field: the row to merge, or why it is
 * refused. An entry without updated_at is taken as updated now (exports
 * written by hand or by older directors often lack it).
 */
function fromEntry(e: KnowledgeEntry, now: Date): KnowledgeRow | { reason: string } {
  try {
    if (e.origin === "") return { reason: "origin must not be empty" };
    if (e.origin.length > 256) return { reason: "origin is longer than 256 characters" };
    const version = Number(e.version);
    if (!Number.isSafeInteger(version) || version < 1)
      return { reason: "version must be a positive integer" };
    const updatedAt = e.updatedAt ? timestampDate(e.updatedAt) : now;
    if (!isStorableTime(updatedAt)) return { reason: "updated_at is out of range" };
    return {
      kind: text("kind", e.kind),
      key: text("key", e.key),
      value: shallowJson("value", (e.value ?? {}) as Record<string, unknown>),
      version,
      updatedAt,
      origin: e.origin,
    };
  } catch (error) {
    if (error instanceof DomainError) return { reason: error.message };
    throw error;
  }
}

/** At most this many rejections are explained in an import's answer. */
const explainedRejections = 100;

/** KnowledgeService: versioned entries, and export/import between coordinators. */
export function createKnowledgeService(app: {
  knowledge: KnowledgeStore;
}): ServiceImpl<typeof KnowledgeService> {
  const store = app.knowledge;
  return {
    async putEntry(req) {
      const version = Number(req.version);
      if (!Number.isSafeInteger(version) || version < 0)
        throw invalid("version must not be negative");
      const row = await store.put(
        text("kind", req.kind),
        text("key", req.key),
        shallowJson("value", (req.value ?? {}) as Record<string, unknown>),
        version,
      );
      return { entry: toEntry(row) };
    },

    async getEntry(req) {
      return { entry: toEntry(await store.get(text("kind", req.kind), text("key", req.key))) };
    },

    async listEntries(req) {
      const size = pageSize(req.pageSize);
      const rows = await store.page(
        { kind: req.kind === "" ? undefined : req.kind },
        size + 1,
        decodePageToken(req.pageToken, 2),
      );
      const page = pageOf(rows, size, positionOf);
      return { entries: page.rows.map(toEntry), nextPageToken: page.next };
    },

    async deleteEntry(req) {
      await store.remove(text("kind", req.kind), text("key", req.key));
      return {};
    },

    async *exportKnowledge(req, ctx) {
      const filter = {
        kind: req.kind === "" ? undefined : req.kind,
        since: req.since ? timeField("since", timestampDate(req.since)) : undefined,
      };
      let after: Position | undefined;
      for (;;) {
        if (ctx.signal.aborted) return;
        const rows = await store.page(filter, exportPage, after);
        if (rows.length > 0) yield { entries: rows.map(toEntry) };
        const last = rows[rows.length - 1];
        if (rows.length < exportPage || !last) return;
        after = positionOf(last);
      }
    },

    async importKnowledge(req) {
      const valid: KnowledgeRow[] = [];
      const rejections: ImportRejection[] = [];
      let rejected = 0;
      const now = new Date();
      req.entries.forEach((e, index) => {
        const row = fromEntry(e, now);
        if (!("reason" in row)) {
          valid.push(row);
          return;
        }
        rejected++;
        if (rejections.length < explainedRejections) {
          rejections.push(
            create(ImportRejectionSchema, {
              index,
              kind: e.kind.slice(0, 256),
              key: e.key.slice(0, 256),
              reason: row.reason,
            }),
          );
        }
      });
      const counts = await store.merge(valid);
      return {
        inserted: BigInt(counts.inserted),
        updated: BigInt(counts.updated),
        unchanged: BigInt(counts.unchanged),
        rejected: BigInt(rejected),
        rejections,
      };
    },
  };
}
