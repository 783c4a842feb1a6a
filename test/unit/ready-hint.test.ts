import { describe, expect, it } from "vitest";
import { hintLife, readyHintMaxMs, readyHintMs } from "../../src/leases/claim.js";

// How long a claim batch's hint of the first ready task is kept
// (leases/claim.ts): a second while the look from the head is quick, 50
// times the look when it is slow, never more than a minute.
describe("the ready hint's life", () => {
  it("is a second while the look from the head takes well under a millisecond", () => {
    expect(hintLife(0.3)).toBe(readyHintMs);
    expect(hintLife(0)).toBe(1000);
  });

  it("is 50 times a slow look, up to a minute", () => {
    expect(hintLife(100)).toBe(5000);
    expect(hintLife(1000)).toBe(50_000);
    expect(hintLife(5000)).toBe(readyHintMaxMs);
    expect(readyHintMaxMs).toBe(60_000);
  });

  it("is at least what the store was given", () => {
    expect(hintLife(0.3, 300)).toBe(300);
    expect(hintLife(100, 300)).toBe(5000);
    expect(hintLife(0.3, 90_000)).toBe(90_000);
  });
});
