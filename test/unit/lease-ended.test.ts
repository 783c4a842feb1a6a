import { describe, expect, it } from "vitest";
import { leaseEndedAt } from "../../src/tasks/convert.js";

const t = (s: number) => new Date(Date.UTC(2026, 0, 1, 12, 0, s));

describe("when a task's last lease ended", () => {
  it("is unset while the lease holds, its expiry once run out, and the change that ended it otherwise", () => {
    const now = t(30);
    const base = { finishedAt: null, updatedAt: t(5) };
    expect(leaseEndedAt({ ...base, state: "RUNNING", leaseExpiresAt: t(50) }, now)).toBeNull();
    // Run out, not yet swept.
    expect(leaseEndedAt({ ...base, state: "RUNNING", leaseExpiresAt: t(20) }, now)).toEqual(t(20));
    // Failed and back to PENDING before its expiry: when it failed.
    expect(
      leaseEndedAt(
        { state: "PENDING", leaseExpiresAt: t(50), finishedAt: null, updatedAt: t(10) },
        now,
      ),
    ).toEqual(t(10));
    // Swept after it ran out: at the expiry, not at the sweep.
    expect(
      leaseEndedAt(
        { state: "PENDING", leaseExpiresAt: t(8), finishedAt: null, updatedAt: t(12) },
        now,
      ),
    ).toEqual(t(8));
    // Finished: when it finished, though the lease would have run a minute more.
    expect(
      leaseEndedAt(
        { state: "SUCCEEDED", leaseExpiresAt: t(59), finishedAt: t(3), updatedAt: t(4) },
        now,
      ),
    ).toEqual(t(3));
  });
});
