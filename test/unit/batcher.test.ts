import { describe, expect, it } from "vitest";
import { createBatcher } from "../../src/leases/batcher.js";

describe("group commit batcher", () => {
  it("runs a lone call at once and folds calls made meanwhile into the next batch", async () => {
    const batches: number[][] = [];
    const double = createBatcher(async (items: number[]) => {
      batches.push(items);
      await new Promise((r) => setTimeout(r, 10));
      return items.map((i) => i * 2);
    });
    const results = await Promise.all([1, 2, 3, 4].map((i) => double(i)));
    expect(results).toEqual([2, 4, 6, 8]);
    expect(batches).toEqual([[1], [2, 3, 4]]);
  });

  it("folds calls that arrive while a statement holds the thread into one batch", async () => {
    // PGlite runs a statement in this thread: it settles without the event
    // loop turning, and calls sent meanwhile are read only afterwards.
    const batches: number[][] = [];
    const run = createBatcher(async (items: number[]) => {
      batches.push(items);
      const until = Date.now() + 5;
      while (Date.now() < until) {
        // the database at work
      }
      return items;
    });
    // Three calls that the event loop delivers after the first statement.
    const later = [1, 2, 3].map(
      (i) => new Promise<number>((resolve) => setImmediate(() => resolve(run(i)))),
    );
    const results = await Promise.all([run(0), ...later]);
    expect(results).toEqual([0, 1, 2, 3]);
    expect(batches).toEqual([[0], [1, 2, 3]]);
  });

  it("fails every caller of a failed batch, and recovers for the next", async () => {
    let fail = true;
    const run = createBatcher(async (items: string[]) => {
      if (fail) throw new Error("database down");
      return items;
    });
    await expect(run("a")).rejects.toThrow("database down");
    fail = false;
    await expect(run("b")).resolves.toBe("b");
  });

  it("caps a batch at maxBatch items", async () => {
    const sizes: number[] = [];
    const run = createBatcher(
      async (items: number[]) => {
        sizes.push(items.length);
        await new Promise((r) => setTimeout(r, 5));
        return items;
      },
      { maxBatch: 2 },
    );
    await Promise.all([1, 2, 3, 4, 5, 6].map((i) => run(i)));
    expect(sizes).toEqual([1, 2, 2, 1]);
  });

  it("weighs items by size: whole items in a batch up to maxBatch in all, an oversized one alone", async () => {
    const batches: string[][] = [];
    const run = createBatcher(
      async (items: string[]) => {
        batches.push(items);
        await new Promise((r) => setTimeout(r, 5));
        return items.map((i) => i.length);
      },
      { maxBatch: 4, size: (i) => i.length },
    );
    const results = await Promise.all(["a", "bb", "cc", "ddddd", "e", "fff", "g"].map(run));
    expect(results).toEqual([1, 2, 2, 5, 1, 3, 1]);
    expect(batches).toEqual([["a"], ["bb", "cc"], ["ddddd"], ["e", "fff"], ["g"]]);
  });

  it("runs a batch once more after an error it may retry, and only once", async () => {
    let calls = 0;
    const lost = Object.assign(new Error("connection lost"), { code: "CONNECTION_CLOSED" });
    const run = createBatcher(
      async (items: number[]) => {
        calls++;
        if (calls === 1) throw lost;
        return items.map((i) => i * 10);
      },
      { retryable: (e) => (e as { code?: string }).code === "CONNECTION_CLOSED" },
    );
    await expect(run(4)).resolves.toBe(40);
    expect(calls).toBe(2);
    const always = createBatcher(
      async () => {
        calls++;
        throw lost;
      },
      { retryable: () => true },
    );
    calls = 0;
    await expect(always(1)).rejects.toBe(lost);
    expect(calls).toBe(2);
    const never = createBatcher(async () => {
      calls++;
      throw new Error("a bug");
    });
    calls = 0;
    await expect(never(1)).rejects.toThrow("a bug");
    expect(calls).toBe(1);
  });
});
