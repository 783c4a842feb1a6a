import { describe, expect, it } from "vitest";
import { createSweeper, type SweeperDeps, wholePassMs } from "../../src/leases/sweeper.js";

/** A sweeper over stand-ins that record how each pass looked for expired leases. */
function sweeperRecording(intervalMs: number) {
  const fromMark: boolean[] = [];
  const none = async () => [];
  const leases = {
    expireLeases: async (_limit: number, mark = false) => {
      fromMark.push(mark);
      return [];
    },
    timeoutAttempts: none,
    failPastDeadline: none,
    dueRetries: async () => new Map<string, number>(),
  };
  const counter = { inc: () => {} };
  const deps = {
    leases,
    heartbeats: { flush: async () => {} },
    events: { emit: () => {} },
    wakeups: { notify: () => {} },
    log: { info: () => {}, error: () => {} },
    metrics: {
      leaseExpiries: counter,
      sweeperRuns: counter,
      sweeperDuration: { startTimer: () => () => 0 },
    },
  } as unknown as SweeperDeps;
  return { sweeper: createSweeper(deps, intervalMs), fromMark };
}

describe("the sweeper's lease expiry", () => {
  it("looks through every expired lease at its first pass and once a minute, from the mark at the others", async () => {
    const { sweeper, fromMark } = sweeperRecording(wholePassMs / 3);
    for (let i = 0; i < 7; i++) await sweeper.runOnce();
    expect(fromMark).toEqual([false, true, true, false, true, true, false]);
  });

  it("makes every pass whole when it runs less often than once a minute", async () => {
    const { sweeper, fromMark } = sweeperRecording(2 * wholePassMs);
    for (let i = 0; i < 3; i++) await sweeper.runOnce();
    expect(fromMark).toEqual([false, false, false]);
  });
});
