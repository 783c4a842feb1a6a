import { afterEach, describe, expect, it, vi } from "vitest";
import { createShareBook, readInterval, readMaxIntervalMs } from "../../src/scheduling/book.js";
import type { SchedulingStore } from "../../src/scheduling/store.js";

/** A book over a store that reads an idle fleet of 10 slots, but for the reads in `parts`. */
function bookOver(parts: Partial<Record<keyof SchedulingStore, unknown>>) {
  const store = {
    fleetCapacity: async () => ({ slots: 10 }),
    heldByShare: async () => new Map(),
    sharesWithPending: async () => [],
    weights: async () => new Map(),
    usage: async () => new Map(),
    decayUsage: async () => {},
    ...parts,
  } as unknown as SchedulingStore;
  return createShareBook({
    store,
    config: { shareHalfLifeMs: 60_000, reserveAfterMs: 0 },
    log: { warn: () => {} } as never,
  });
}

/** A book over a store whose reads each take `readMs` (and fail, if said); `reads` counts them. */
function bookReading(readMs: number, fail = false) {
  let reads = 0;
  const slow = <T>(value: T) =>
    new Promise<T>((resolve, reject) =>
      setTimeout(() => (fail ? reject(new Error("connection lost")) : resolve(value)), readMs),
    );
  const book = bookOver({
    heldByShare: async () => {
      reads += 1;
      return slow(new Map());
    },
  });
  return { book, reads: () => reads };
}

// The share book reads its tables every second while reads are quick, and
// less often while they are slow (scheduling/book.ts, readInterval).
describe("the share book's reads", () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it("come every second while they take a few milliseconds", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
    const { book, reads } = bookReading(5);
    book.start(1000);
    await vi.advanceTimersByTimeAsync(10_000);
    await book.stop();
    expect(reads()).toBeGreaterThanOrEqual(9);
    expect(reads()).toBeLessThanOrEqual(11);
  });

  it("come at most once every 20 times as long as a slow one took", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
    const { book, reads } = bookReading(400);
    book.start(1000);
    // Reads at 0 and 8.4 s (400 ms each, 8 s apart), then at 16.8 s.
    await vi.advanceTimersByTimeAsync(16_000);
    await book.stop();
    expect(reads()).toBe(2);
  });

  it("are tried again every second after failed reads, however long they took to fail", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
    const { book, reads } = bookReading(400, true);
    book.start(1000);
    // Reads at 0, 1.4, 2.8, … s: every second after each failure.
    await vi.advanceTimersByTimeAsync(16_000);
    await book.stop();
    expect(reads()).toBeGreaterThanOrEqual(11);
  });

  it("wait a second at least and ten seconds at most", () => {
    expect(readInterval(2)).toBe(1000);
    expect(readInterval(100)).toBe(2000);
    expect(readInterval(3000)).toBe(readMaxIntervalMs);
    expect(readMaxIntervalMs).toBe(10_000);
  });

  it("move usage on only while a share holds, waits or has usage left to decay", async () => {
    const decays: Map<string, number>[] = [];
    let held = new Map<string, unknown>();
    let usage = new Map<string, number>();
    const book = bookOver({
      heldByShare: async () => held,
      usage: async () => usage,
      decayUsage: async (allocation: Map<string, number>) => {
        decays.push(allocation);
      },
    });
    await book.refresh();
    expect(decays).toEqual([]);
    held = new Map([["render", { held: { slots: 5 }, running: 5 }]]);
    await book.refresh();
    expect(decays).toEqual([new Map([["render", 0.5]])]);
    // Its leases ended: the usage it left still decays.
    held = new Map();
    usage = new Map([["render", 2.5]]);
    await book.refresh();
    expect(decays).toHaveLength(2);
    expect(decays[1]).toEqual(new Map());
  });
});

// Between reads, the leases this replica grants and ends count at once: the
// next claim's plan already sees them.
describe("the share book between reads", () => {
  it("plans the next claim with the grants and ends made since the last read", async () => {
    const book = bookOver({
      sharesWithPending: async () => ["a", "b"],
      weights: async () =>
        new Map([
          ["a", 1],
          ["b", 1],
        ]),
    });
    await book.refresh();
    // The first share of the first claim's plan.
    const first = () => book.plans([1, 1])[0]?.shares[0];
    // Equal and idle: the tie goes to the first path.
    expect(first()).toBe("a");
    book.granted([{ share: "a", resources: { slots: 3 } }]);
    // What the waiting reasons and the metrics read, as well as the plan.
    expect(book.snapshot().order.map((s) => s.path)).toEqual(["b", "a"]);
    expect(first()).toBe("b");
    book.granted([{ share: "b", resources: { slots: 4 } }]);
    expect(first()).toBe("a");
    book.ended([{ share: "b", resources: { slots: 4 } }]);
    expect(first()).toBe("b");
  });
});
