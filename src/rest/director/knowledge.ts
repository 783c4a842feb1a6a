import { create, type JsonObject } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import {
  type KnowledgeEntry,
  KnowledgeEntrySchema,
} from "../../../gen/meshwork/v1/knowledge_pb.js";
import { DomainError, invalid } from "../../core/errors.js";
import type { PlainRoute } from "../../http/routes.js";
import { field, type JsonBody, parseTime } from "../body.js";
import { type DirectorRoute, iso, type Session } from "./session.js";

/** The knowledge routes: export by group, and import with a reason for each entry rejected. */
export function knowledgeRoutes(route: DirectorRoute): PlainRoute[] {
  return [
    route(
      ["GET"],
      "/knowledge/export",
      ["KnowledgeService/ExportKnowledge"],
      "export knowledge",
      async (s, req) => {
        const query = new URL(req.url ?? "/", "http://x").searchParams;
        const sinceText = query.get("since");
        const since = sinceText === null ? undefined : parseTime(sinceText);
        if (sinceText !== null && !since) throw invalid("since must be an RFC 3339 time");
        const groups: Record<string, unknown[]> = { adaptations: [], patterns: [] };
        for await (const page of s.knowledge.exportKnowledge({
          kind: query.get("kind") ?? "",
          since: since && timestampFromDate(since),
        })) {
          for (const e of page.entries) {
            const group = `${e.kind}s`;
            groups[group] ??= [];
            groups[group].push({
              kind: e.kind,
              key: e.key,
              value: e.value ?? {},
              version: Number(e.version),
              updatedAt: iso(e.updatedAt),
              origin: e.origin,
            });
          }
        }
        return [200, groups];
      },
    ),

    route(
      ["POST"],
      "/knowledge/import",
      ["KnowledgeService/ImportKnowledge"],
      "import knowledge",
      async (s, _req) => {
        const body = await s.json("any");
        return [200, await importKnowledge(s, body)];
      },
    ),
  ];
}

/** Knowledge groups are named after their kind: `adaptation` → `adaptations`. */
const kindOfGroup = (group: string) => (group.endsWith("s") ? group.slice(0, -1) : group);

/**
 * Imports `{"adaptations": [...], "patterns": [...], "<kind>s": [...]}`:
 * every entry goes to ImportKnowledge, which merges them and says why it
 * rejects any; an entry JSON cannot turn into a KnowledgeEntry is rejected
 * here with its reason. Rejections name the group and the index in it.
 */
async function importKnowledge(s: Session, body: JsonBody) {
  const entries: KnowledgeEntry[] = [];
  const origins: { group: string; index: number }[] = [];
  const rejections: { group: string; index: number; key: string; reason: string }[] = [];
  let rejected = 0;
  const reject = (group: string, index: number, key: string, reason: string) => {
    rejected++;
    if (rejections.length < 100) rejections.push({ group, index, key, reason });
  };
  for (const [group, list] of Object.entries(body)) {
    if (!Array.isArray(list)) throw invalid(`${group.slice(0, 64)} must be a list of entries`);
    list.forEach((item: unknown, index) => {
      const e = item as JsonBody;
      const key = typeof e?.key === "string" ? e.key : "";
      try {
        if (typeof item !== "object" || item === null || Array.isArray(item)) {
          throw invalid("an entry must be a JSON object");
        }
        const kind = field.string(e, "kind") ?? kindOfGroup(group);
        if (kind !== kindOfGroup(group)) throw invalid(`kind ${kind} does not belong in ${group}`);
        const version = e.version;
        if (
          version !== undefined &&
          (typeof version !== "number" || !Number.isSafeInteger(version))
        ) {
          throw invalid("version must be a whole number");
        }
        const updatedAt = field.time(e, "updatedAt");
        entries.push(
          create(KnowledgeEntrySchema, {
            kind,
            key: field.string(e, "key") ?? "",
            value: (field.object(e, "value") ?? {}) as JsonObject,
            version: BigInt(version ?? 0),
            updatedAt: updatedAt && timestampFromDate(updatedAt),
            origin: field.string(e, "origin") ?? "",
          }),
        );
        origins.push({ group, index });
      } catch (error) {
        if (!(error instanceof DomainError)) throw error;
        reject(group, index, key, error.message);
      }
    });
  }
  const counts = await s.knowledge.importKnowledge({ entries });
  for (const r of counts.rejections) {
    const from = origins[r.index];
    if (from) reject(from.group, from.index, r.key, r.reason);
  }
  rejected += Number(counts.rejected) - counts.rejections.length;
  return {
    inserted: Number(counts.inserted),
    updated: Number(counts.updated),
    unchanged: Number(counts.unchanged),
    rejected,
    rejections: rejections.sort((a, b) =>
      a.group === b.group ? a.index - b.index : a.group < b.group ? -1 : 1,
    ),
  };
}
