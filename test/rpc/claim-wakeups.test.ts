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

describe("the ready counts' notification", () => {
  it("stays within NOTIFY's 8,000 bytes whatever the workload names: long multi-byte names create and wake", async () => {
    // 11 workloads of 256 three-byte characters: ~8.5 KB of JSON in under 3,000 characters.
    const names = Array.from(
      { length: 11 },
      (_, i) => `${"渲".repeat(250)}${uniqueWorkload(String(i)).slice(-6)}`,
    );
    const workerId = await registerWorker(h, [names[0] ?? ""]);
    const abort = new AbortController();
    const poll = h.leases.claimTasks(
      { workerId, maxTasks: 1, waitSeconds: 30 },
      { signal: abort.signal },
    );
    await until(() => h.app.wakeups.parked() >= 1);
    const { tasks } = await h.tasks.createTasks({ tasks: names.map((workload) => ({ workload })) });
    expect(tasks).toHaveLength(11);
    // Too long to carry the counts, the notification wakes every parked claim instead.
    expect((await poll).claims.map((c) => c.workload)).toEqual([names[0]]);
    abort.abort();
  });
});
