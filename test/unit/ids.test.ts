import { describe, expect, it } from "vitest";
import { formatId, type IdClock, newTaskId, tick } from "../../src/core/ids.js";

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

  describe("their clock", () => {
    const ms = (id: string) => Number.parseInt(id.replaceAll("-", "").slice(0, 12), 16);
    const random = new Uint8Array(16).fill(0xff);
    const t = 1_760_000_000_000;

    /** The ids of `count` ticks from `clock`, each at time `now` (the clock's own when not given). */
    function ids(clock: IdClock, count: number, now = clock.msecs): string[] {
      return Array.from({ length: count }, () => {
        tick(clock, now, random, 0);
        return formatId(clock, random, 0);
      });
    }

    it("starts a new millisecond's counter at a random 31-bit value", () => {
      const clock: IdClock = { msecs: t - 1, seq: 12 };
      tick(clock, t, random, 0);
      expect(clock).toEqual({ msecs: t, seq: 0x7fffffff });
      const id = formatId(clock, random, 0);
      expect(id).toMatch(v7);
      expect(ms(id)).toBe(t);
    });

    it("keeps the order past the counter's sign bit and when it runs over into the next millisecond", () => {
      const pastSign = ids({ msecs: t, seq: 0x7ffffffe }, 3);
      const overflow = ids({ msecs: t, seq: -3 }, 4);
      for (const made of [pastSign, overflow]) {
        for (const id of made) expect(id).toMatch(v7);
        expect([...made].sort()).toEqual(made);
        expect(new Set(made).size).toBe(made.length);
      }
      // -3 counts to -2 and -1 in its millisecond, then 0 and 1 in the next (borrowed).
      expect(overflow.map(ms)).toEqual([t, t, t + 1, t + 1]);
    });

    it("counts on in the last millisecond when the clock goes back", () => {
      const clock: IdClock = { msecs: t, seq: 5 };
      const made = ids(clock, 3, t - 10);
      expect(clock).toEqual({ msecs: t, seq: 8 });
      expect(made.map(ms)).toEqual([t, t, t]);
      expect([...made].sort()).toEqual(made);
    });
  });
});
