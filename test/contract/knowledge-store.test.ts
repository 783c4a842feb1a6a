import { beforeAll, expect, it } from "vitest";
import { decodePageToken, encodePageToken } from "../../src/core/paging.js";
import type { KnowledgeRow } from "../../src/db/schema/index.js";
import { createKnowledgeStore, type KnowledgeStore } from "../../src/knowledge/store.js";
import { describeEachEngine } from "../support/engines.js";
import { uniqueWorkload } from "../support/harness.js";

describeEachEngine("knowledge store", (db) => {
  let store: KnowledgeStore;
  beforeAll(() => {
    store = createKnowledgeStore(db().db);
  });

  const entry = (
    kind: string,
    key: string,
    version: number,
    time: string,
    origin: string,
  ): KnowledgeRow => ({
    kind,
    key,
    value: { v: `${version}@${time}/${origin}` },
    version,
    updatedAt: new Date(time),
    origin,
  });

  it("keeps one origin per database, the same from every store on it", async () => {
    const origin = await store.origin();
    expect(origin).toMatch(/^[0-9a-f-]{36}$/);
    expect(await createKnowledgeStore(db().db).origin()).toBe(origin);
  });

  it("versions local writes: 0 means next, an explicit version must be newer", async () => {
    const kind = uniqueWorkload("pattern");
    expect((await store.put(kind, "k", { a: 1 }, 0)).version).toBe(1);
    expect((await store.put(kind, "k", { a: 2 }, 0)).version).toBe(2);
    expect((await store.put(kind, "k", { a: 3 }, 7)).version).toBe(7);
    await expect(store.put(kind, "k", { a: 4 }, 7)).rejects.toMatchObject({
      kind: "aborted",
      reason: "VERSION_CONFLICT",
    });
    expect(await store.get(kind, "k")).toMatchObject({ version: 7, value: { a: 3 } });
  });

  it("answers not_found for a missing entry, on read and on delete", async () => {
    const kind = uniqueWorkload("pattern");
    await expect(store.get(kind, "none")).rejects.toMatchObject({ kind: "not_found" });
    await expect(store.remove(kind, "none")).rejects.toMatchObject({ kind: "not_found" });
    await store.put(kind, "k", {}, 0);
    await store.remove(kind, "k");
    await expect(store.get(kind, "k")).rejects.toMatchObject({ kind: "not_found" });
  });

  it("merges by version, then updated_at, then origin, and counts what changed", async () => {
    const kind = uniqueWorkload("adaptation");
    const base = entry(kind, "k", 2, "2026-01-01T00:00:00Z", "m");
    expect(await store.merge([base])).toEqual({ inserted: 1, updated: 0, unchanged: 0 });
    const cases: [KnowledgeRow, boolean][] = [
      [entry(kind, "k", 1, "2026-06-01T00:00:00Z", "z"), false], // lower version loses
      [entry(kind, "k", 2, "2025-12-31T00:00:00Z", "z"), false], // same version, older loses
      [entry(kind, "k", 2, "2026-01-01T00:00:00Z", "a"), false], // same time, smaller origin loses
      [entry(kind, "k", 2, "2026-01-01T00:00:00Z", "n"), true], // greater origin wins
      [entry(kind, "k", 2, "2026-02-01T00:00:00Z", "a"), true], // later time wins
      [entry(kind, "k", 3, "2020-01-01T00:00:00Z", "a"), true], // higher version wins
    ];
    for (const [e, wins] of cases) {
      const before = await store.get(kind, "k");
      const counts = await store.merge([e]);
      expect(counts).toEqual({ inserted: 0, updated: wins ? 1 : 0, unchanged: wins ? 0 : 1 });
      expect(await store.get(kind, "k")).toEqual(wins ? e : before);
    }
  });

  it("changes nothing when the same entries are merged twice, duplicates included", async () => {
    const kind = uniqueWorkload("adaptation");
    const batch = [
      entry(kind, "a", 1, "2026-01-01T00:00:00Z", "x"),
      entry(kind, "b", 1, "2026-01-01T00:00:00Z", "x"),
      entry(kind, "b", 5, "2026-01-01T00:00:00Z", "x"),
    ];
    expect(await store.merge(batch)).toEqual({ inserted: 2, updated: 0, unchanged: 1 });
    expect((await store.get(kind, "b")).version).toBe(5);
    expect(await store.merge(batch)).toEqual({ inserted: 0, updated: 0, unchanged: 3 });
  });

  it("pages in (updated_at, kind, key) order from a position, by kind and since", async () => {
    const kind = uniqueWorkload("pattern");
    const rows = ["c", "a", "b"].map((key, i) =>
      entry(kind, key, 1, `2026-03-0${i === 0 ? 1 : 2}T00:00:00Z`, "o"),
    );
    await store.merge(rows);
    const all = await store.page({ kind }, 10, undefined);
    expect(all.map((r) => r.key)).toEqual(["c", "a", "b"]);
    const first = all[0] as KnowledgeRow;
    const token = encodePageToken({ at: first.updatedAt, keys: [first.kind, first.key] });
    const after = await store.page({ kind }, 10, decodePageToken(token, 2));
    expect(after.map((r) => r.key)).toEqual(["a", "b"]);
    const since = await store.page(
      { kind, since: new Date("2026-03-01T12:00:00Z") },
      10,
      undefined,
    );
    expect(since.map((r) => r.key)).toEqual(["a", "b"]);
    expect(() => decodePageToken("not-a-token", 2)).toThrow(/page_token/);
  });
});
