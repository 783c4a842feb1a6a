import { create, type JsonObject } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  type KnowledgeEntry,
  KnowledgeEntrySchema,
  type KnowledgeService,
} from "../../gen/meshwork/v1/knowledge_pb.js";
import type { App } from "../app.js";
import { StoreError } from "../db/errors.js";
import { pageSize } from "../db/paging.js";
import type { KnowledgeRow } from "../db/schema/index.js";
import { invalid } from "../rpc/errors.js";
import { text } from "../tasks/convert.js";
import type { KnowledgeCursor } from "./store.js";

const exportPage = 500;

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
    if (Number.isNaN(updatedAt.getTime())) return undefined;
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

function encodeCursor(c: KnowledgeCursor): string {
  return Buffer.from(JSON.stringify([c.at.getTime(), c.kind, c.key])).toString("base64url");
}

function decodeCursor(token: string): KnowledgeCursor | undefined {
  if (token === "") return undefined;
  try {
    const [ms, kind, key] = JSON.parse(Buffer.from(token, "base64url").toString()) as unknown[];
    if (typeof ms === "number" && typeof kind === "string" && typeof key === "string") {
      return { at: new Date(ms), kind, key };
    }
  } catch {
    // fall through
  }
  throw new StoreError(
    "invalid_argument",
    "INVALID_PAGE_TOKEN",
    "page_token is not a token this server issued",
  );
}

/** KnowledgeService: versioned entries, and export/import between coordinators. */
export function createKnowledgeService(app: App): ServiceImpl<typeof KnowledgeService> {
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
        decodeCursor(req.pageToken),
      );
      const page = rows.slice(0, size);
      const last = page[page.length - 1];
      return {
        entries: page.map(toEntry),
        nextPageToken:
          rows.length > size && last
            ? encodeCursor({ at: last.updatedAt, kind: last.kind, key: last.key })
            : "",
      };
    },

    async deleteEntry(req) {
      await store.remove(text("kind", req.kind), text("key", req.key));
      return {};
    },

    async *exportKnowledge(req, ctx) {
      const filter = {
        kind: req.kind === "" ? undefined : req.kind,
        since: req.since ? timestampDate(req.since) : undefined,
      };
      let after: KnowledgeCursor | undefined;
      for (;;) {
        if (ctx.signal.aborted) return;
        const rows = await store.page(filter, exportPage, after);
        if (rows.length > 0) yield { entries: rows.map(toEntry) };
        const last = rows[rows.length - 1];
        if (rows.length < exportPage || !last) return;
        after = { at: last.updatedAt, kind: last.kind, key: last.key };
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
