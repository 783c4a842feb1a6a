import { create, type JsonObject } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  type KnowledgeEntry,
  KnowledgeEntrySchema,
  type KnowledgeService,
} from "../../gen/meshwork/v1/knowledge_pb.js";
import { invalid } from "../core/errors.js";
import { decodePageToken, type Position, pageOf, pageSize } from "../core/paging.js";
import { isStorableTime, text, timeField } from "../core/validate.js";
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

/** An imported entry checked field by field; undefined when malformed. */
function fromEntry(e: KnowledgeEntry): KnowledgeRow | undefined {
  try {
    if (!e.updatedAt || e.origin === "" || e.origin.length > 256) return undefined;
    const version = Number(e.version);
    if (!Number.isSafeInteger(version) || version < 1) return undefined;
    const updatedAt = timestampDate(e.updatedAt);
    if (!isStorableTime(updatedAt)) return undefined;
    return {
      kind: text("kind", e.kind),
      key: text("key", e.key),
      value: (e.value ?? {}) as Record<string, unknown>,
      version,
      updatedAt,
      origin: e.origin,
    };
  } catch {
    return undefined;
  }
}

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
        (req.value ?? {}) as Record<string, unknown>,
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
      let rejected = 0;
      for (const e of req.entries) {
        const row = fromEntry(e);
        if (row) valid.push(row);
        else rejected++;
      }
      const counts = await store.merge(valid);
      return {
        inserted: BigInt(counts.inserted),
        updated: BigInt(counts.updated),
        unchanged: BigInt(counts.unchanged),
        rejected: BigInt(rejected),
      };
    },
  };
}
