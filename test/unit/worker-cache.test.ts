import { afterEach, describe, expect, it, vi } from "vitest";
import { notFound } from "../../src/core/errors.js";
import type { WorkerRow } from "../../src/db/schema/index.js";
import { createWorkerCache } from "../../src/fleet/cache.js";

/** A fleet whose rows are `rows`, counting the reads it answers. */
function fleetOf(rows: Map<string, Partial<WorkerRow>>) {
  const reads: string[] = [];
  return {
    reads,
    async row(id: string): Promise<WorkerRow> {
      reads.push(id);
      // The row as it is when the read starts, answered a moment later.
      const row = rows.get(id);
      await new Promise((r) => setTimeout(r, 1));
      if (!row) throw notFound(id);
      return { ...row, id } as WorkerRow;
    },
  };
}

describe("worker cache", () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it("reads a worker's row once for the calls of a moment, and again after ttl or forget", async () => {
    const rows = new Map([["w1", { drained: false, capabilities: ["a"] }]]);
    const fleet = fleetOf(rows);
    const cache = createWorkerCache(fleet, 1000);
    // Calls made together share one read.
    const [a, b] = await Promise.all([cache.get("w1"), cache.get("w1")]);
    expect(a).toMatchObject({ id: "w1", capabilities: ["a"] });
    expect(b).toBe(a);
    expect(await cache.get("w1")).toBe(a);
    expect(fleet.reads).toEqual(["w1"]);

    // A change made here is seen at once.
    rows.set("w1", { drained: true, capabilities: ["a"] });
    cache.forget("w1");
    expect((await cache.get("w1")).drained).toBe(true);
    expect(fleet.reads).toEqual(["w1", "w1"]);

    // One made through another replica, once the ttl has passed.
    rows.set("w1", { drained: false, capabilities: ["b"] });
    vi.useFakeTimers({ toFake: ["Date"], now: Date.now() + 1001 });
    expect((await cache.get("w1")).capabilities).toEqual(["b"]);
    expect(fleet.reads).toEqual(["w1", "w1", "w1"]);
  });

  it("does not keep a read that was under way when the worker was forgotten", async () => {
    const rows = new Map([["w1", { drained: false }]]);
    const fleet = fleetOf(rows);
    const cache = createWorkerCache(fleet, 60_000);
    const before = cache.get("w1");
    rows.set("w1", { drained: true });
    cache.forget("w1");
    expect((await cache.get("w1")).drained).toBe(true);
    await before;
    expect((await cache.get("w1")).drained).toBe(true);
    expect(fleet.reads).toEqual(["w1", "w1"]);
  });

  it("remembers no failure: an unknown worker is not_found each time", async () => {
    const fleet = fleetOf(new Map());
    const cache = createWorkerCache(fleet);
    await expect(cache.get("gone")).rejects.toMatchObject({ kind: "not_found" });
    await expect(cache.get("gone")).rejects.toMatchObject({ kind: "not_found" });
    expect(fleet.reads).toEqual(["gone", "gone"]);
  });
});
