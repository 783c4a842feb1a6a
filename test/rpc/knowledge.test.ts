import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createClient, createRouterTransport } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KnowledgeEntrySchema, KnowledgeService } from "../../gen/meshwork/v1/knowledge_pb.js";
import { createRoutes, rpcInterceptors } from "../../src/server.js";
import { outcome } from "../support/errors.js";
import { appOn, createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

let h: Harness;
let knowledge: ReturnType<typeof createClient<typeof KnowledgeService>>;
beforeAll(async () => {
  h = await createHarness();
  knowledge = createClient(
    KnowledgeService,
    createRouterTransport(createRoutes(h.app), {
      router: { interceptors: rpcInterceptors(h.app) },
    }),
  );
});
afterAll(() => h.close());

const at = (iso: string) => timestampFromDate(new Date(iso));
const entry = (
  kind: string,
  key: string,
  version: number,
  time: string,
  origin: string,
  value = {},
) =>
  create(KnowledgeEntrySchema, {
    kind,
    key,
    version: BigInt(version),
    updatedAt: at(time),
    origin,
    value,
  });

describe("knowledge entries", () => {
  it("puts, versions, reads, lists and deletes entries", async () => {
    const kind = uniqueWorkload("adaptation");
    const first = await knowledge.putEntry({ kind, key: "k1", value: { gain: 1 } });
    expect(first.entry).toMatchObject({ version: 1n, value: { gain: 1 } });
    expect(first.entry?.origin).toBe(await h.app.knowledge.origin());
    const second = await knowledge.putEntry({ kind, key: "k1", value: { gain: 2 } });
    expect(second.entry?.version).toBe(2n);
    expect(
      await outcome(knowledge.putEntry({ kind, key: "k1", value: {}, version: 2n })),
    ).toMatchObject({
      code: "Aborted",
      reason: "VERSION_CONFLICT",
    });
    expect(
      (await knowledge.putEntry({ kind, key: "k1", value: { gain: 9 }, version: 10n })).entry
        ?.version,
    ).toBe(10n);
    await knowledge.putEntry({ kind, key: "k2", value: {} });
    const page1 = await knowledge.listEntries({ kind, pageSize: 1 });
    const page2 = await knowledge.listEntries({
      kind,
      pageSize: 1,
      pageToken: page1.nextPageToken,
    });
    expect([...page1.entries, ...page2.entries].map((e) => e.key)).toEqual(["k1", "k2"]);
    await knowledge.deleteEntry({ kind, key: "k2" });
    expect((await outcome(knowledge.getEntry({ kind, key: "k2" }))).code).toBe("NotFound");
    expect((await knowledge.getEntry({ kind, key: "k1" })).entry?.value).toEqual({ gain: 9 });
  });

  it("merges by version, then time, then origin; a second import of the same entries changes nothing", async () => {
    const kind = uniqueWorkload("pattern");
    const base = [
      entry(kind, "a", 2, "2026-01-01T00:00:00Z", "o-1", { v: "base" }),
      entry(kind, "b", 2, "2026-01-01T00:00:00Z", "o-1", { v: "base" }),
      entry(kind, "c", 2, "2026-01-01T00:00:00Z", "o-1", { v: "base" }),
      entry(kind, "d", 2, "2026-01-01T00:00:00Z", "o-1", { v: "base" }),
    ];
    expect(await knowledge.importKnowledge({ entries: base })).toMatchObject({
      inserted: 4n,
      updated: 0n,
    });
    const incoming = [
      entry(kind, "a", 3, "2025-01-01T00:00:00Z", "o-0", { v: "higher version" }),
      entry(kind, "b", 2, "2026-06-01T00:00:00Z", "o-0", { v: "later time" }),
      entry(kind, "c", 2, "2026-01-01T00:00:00Z", "o-2", { v: "greater origin" }),
      entry(kind, "d", 1, "2027-01-01T00:00:00Z", "o-9", { v: "older version" }),
      entry(kind, "e", 1, "2026-01-01T00:00:00Z", "o-1", { v: "new" }),
      create(KnowledgeEntrySchema, { kind, key: "bad", version: 0n, origin: "" }),
    ];
    expect(await knowledge.importKnowledge({ entries: incoming })).toEqual(
      expect.objectContaining({ inserted: 1n, updated: 3n, unchanged: 1n, rejected: 1n }),
    );
    const values = Object.fromEntries(
      (await knowledge.listEntries({ kind })).entries.map((e) => [
        e.key,
        (e.value as { v: string }).v,
      ]),
    );
    expect(values).toEqual({
      a: "higher version",
      b: "later time",
      c: "greater origin",
      d: "base",
      e: "new",
    });
    expect(await knowledge.importKnowledge({ entries: incoming })).toEqual(
      expect.objectContaining({ inserted: 0n, updated: 0n, unchanged: 5n, rejected: 1n }),
    );
  });

  it("exports by kind and since, in pages, as a stream", async () => {
    const kind = uniqueWorkload("export");
    const many = Array.from({ length: 1200 }, (_, i) =>
      entry(
        kind,
        `k${String(i).padStart(4, "0")}`,
        1,
        i < 600 ? "2026-01-01T00:00:00Z" : "2026-03-01T00:00:00Z",
        "o",
      ),
    );
    await knowledge.importKnowledge({ entries: many });
    let count = 0;
    let messages = 0;
    for await (const res of knowledge.exportKnowledge({ kind })) {
      count += res.entries.length;
      messages++;
    }
    expect(count).toBe(1200);
    expect(messages).toBeGreaterThan(1);
    let recent = 0;
    for await (const res of knowledge.exportKnowledge({
      kind,
      since: at("2026-02-01T00:00:00Z"),
    })) {
      recent += res.entries.length;
    }
    expect(recent).toBe(600);
  });

  it("keeps one origin per database", async () => {
    const again = appOn(h.app.database);
    expect(await again.knowledge.origin()).toBe(await h.app.knowledge.origin());
  });
});
