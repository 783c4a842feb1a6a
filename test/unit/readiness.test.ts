import { describe, expect, it } from "vitest";
import { createReadiness } from "../../src/db/readiness.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("readiness (/readyz, grpc.health.v1.Health)", () => {
  it("pings once for any number of asks at once, and keeps the answer for cacheMs", async () => {
    let pings = 0;
    const ready = createReadiness(
      async () => {
        pings++;
        await sleep(20);
      },
      { cacheMs: 100, timeoutMs: 1000 },
    );
    const answers = await Promise.all(Array.from({ length: 1000 }, () => ready()));
    expect(answers.every((a) => a)).toBe(true);
    expect(pings).toBe(1);
    await ready();
    expect(pings).toBe(1);
    await sleep(120);
    await ready();
    expect(pings).toBe(2);
  });

  it("answers no for a failing ping and for one that takes longer than timeoutMs", async () => {
    const failing = createReadiness(() => Promise.reject(new Error("down")), {
      cacheMs: 0,
      timeoutMs: 1000,
    });
    expect(await failing()).toBe(false);
    const hanging = createReadiness(() => new Promise<void>(() => {}), {
      cacheMs: 0,
      timeoutMs: 30,
    });
    expect(await hanging()).toBe(false);
  });
});
