import { describe, expect, it } from "vitest";
import { isTransientDatabaseError } from "../../src/db/faults.js";
import { createPoolGate, PoolExhaustedError } from "../../src/db/pool-gate.js";

const later = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

describe("the pool gate", () => {
  it("lets `capacity` callers in at once and the rest in arrival order", async () => {
    const gate = createPoolGate(2, 1000);
    const order: number[] = [];
    const runs = [1, 2, 3, 4].map((n) =>
      gate.run(async () => {
        order.push(n);
        await later(20);
      }),
    );
    await later(5);
    expect(order).toEqual([1, 2]);
    expect(gate.stats()).toEqual({ free: 0, waiting: 2 });
    await Promise.all(runs);
    expect(order).toEqual([1, 2, 3, 4]);
    expect(gate.stats()).toEqual({ free: 2, waiting: 0 });
  });

  it("refuses a caller that waits longer than the timeout with a transient error", async () => {
    const gate = createPoolGate(1, 30);
    const holder = gate.run(() => later(200));
    const refused = await gate.run(async () => "ran").catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(PoolExhaustedError);
    expect(isTransientDatabaseError(refused)).toBe(true);
    expect(gate.stats()).toEqual({ free: 0, waiting: 0 });
    await holder;
    expect(await gate.run(async () => "ran")).toBe("ran");
  });

  it("frees the slot when the work fails", async () => {
    const gate = createPoolGate(1, 50);
    await expect(gate.run(() => Promise.reject(new Error("boom")))).rejects.toThrow("boom");
    expect(await gate.run(async () => 1)).toBe(1);
  });
});

describe("the pool gate's urgent lane", () => {
  it("keeps `reserved` slots for urgent work, which a burst of other work cannot take", async () => {
    const gate = createPoolGate(3, 1000, 1);
    const order: string[] = [];
    const hold = (name: string, isUrgent = false) =>
      gate.run(async () => {
        order.push(name);
        await later(30);
      }, isUrgent);
    const runs = [hold("a"), hold("b"), hold("c")];
    await later(5);
    // Two of three slots taken by other work: the third is the urgent lane's.
    expect(order).toEqual(["a", "b"]);
    runs.push(hold("renewal", true));
    await later(5);
    expect(order).toEqual(["a", "b", "renewal"]);
    await Promise.all(runs);
    expect(order).toEqual(["a", "b", "renewal", "c"]);
  });

  it("serves a waiting urgent caller before the other waiters when a slot frees", async () => {
    const gate = createPoolGate(1, 1000, 0);
    const order: string[] = [];
    const hold = (name: string, isUrgent = false) =>
      gate.run(async () => {
        order.push(name);
        await later(20);
      }, isUrgent);
    const runs = [hold("first"), hold("claim"), hold("claim2"), hold("renewal", true)];
    await Promise.all(runs);
    expect(order).toEqual(["first", "renewal", "claim", "claim2"]);
  });
});
