import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { until } from "../support/bounded.js";
import { createHarness, type Harness, registerWorker, uniqueWorkload } from "../support/harness.js";

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(() => h.close());

describe("a burst wakes as many parked claims as it brings tasks", () => {
  it("3 tasks for 8 parked single-task claims wake 3 of them; the others stay parked", async () => {
    const workload = uniqueWorkload("burst");
    const workers = await Promise.all(
      Array.from({ length: 8 }, () => registerWorker(h, [workload])),
    );
    const abort = new AbortController();
    const got: number[] = [];
    const polls = workers.map((workerId) =>
      h.leases
        .claimTasks({ workerId, maxTasks: 1, waitSeconds: 30 }, { signal: abort.signal })
        .then(
          (r) => got.push(r.claims.length),
          () => got.push(-1),
        ),
    );
    await until(() => h.app.wakeups.parked() >= 8);
    // Claims made from here on: the woken ones' looks.
    let looks = 0;
    const claim = h.app.leases.claimCounted;
    h.app.leases.claimCounted = (...args) => {
      looks++;
      return claim(...args);
    };
    // Another workload's tasks wake none of them.
    await h.tasks.createTasks({ tasks: [{ workload: uniqueWorkload("elsewhere") }] });
    await h.tasks.createTasks({
      tasks: [{ workload }, { workload }, { workload }],
    });
    await until(() => got.length === 3);
    expect(got).toEqual([1, 1, 1]);
    // The rest never woke: parked as they were, none came back empty-handed.
    await new Promise((r) => setTimeout(r, 300));
    expect(got).toHaveLength(3);
    expect(h.app.wakeups.parked()).toBe(5);
    expect(looks).toBe(3);
    h.app.leases.claimCounted = claim;
    abort.abort();
    await Promise.all(polls);
  });
});
