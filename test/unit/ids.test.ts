import { describe, expect, it } from "vitest";
import { newTaskId } from "../../src/core/ids.js";

const v7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe("task ids", () => {
  it("are version 7 UUIDs carrying the time they were made", () => {
    const before = Date.now();
    const id = newTaskId();
    const after = Date.now();
    expect(id).toMatch(v7);
    const ms = Number.parseInt(id.replaceAll("-", "").slice(0, 12), 16);
    expect(ms).toBeGreaterThanOrEqual(before);
    // A counter that ran over borrows the next millisecond.
    expect(ms).toBeLessThanOrEqual(after + 1);
  });

  it("sort in the order they were made, distinct, within a millisecond and across many", () => {
    const ids = Array.from({ length: 20_000 }, () => newTaskId());
    for (const id of ids) expect(id).toMatch(v7);
    expect([...ids].sort()).toEqual(ids);
    expect(new Set(ids).size).toBe(ids.length);
    // Random past the counter: two ids of one millisecond differ in their tails.
    const tails = new Set(ids.map((id) => id.slice(-12)));
    expect(tails.size).toBeGreaterThan(ids.length * 0.99);
  });
});
