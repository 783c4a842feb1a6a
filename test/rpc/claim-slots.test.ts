import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { outcome } from "../support/errors.js";
import { expireLease } from "../support/fixtures.js";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(() => h.close());

/** A worker for a fresh workload with `tasks` PENDING tasks of it; max_concurrency as given (else the default). */
async function setUp(tasks: number, maxConcurrency?: number) {
  const workload = uniqueWorkload();
  const { workerId } = await h.fleet.registerWorker({ capabilities: [workload], maxConcurrency });
  for (let i = 0; i < tasks; i++) await h.tasks.createTask({ workload });
  return { workerId, workload };
}

/** What a user reads in a claim answer: how many claims, the slots left and the cap. */
async function claim(workerId: string, maxTasks: number, extra: object = {}) {
  const res = await h.leases.claimTasks({ workerId, maxTasks, ...extra });
  return {
    claims: res.claims.length,
    freeSlots: res.freeSlots,
    maxConcurrency: res.maxConcurrency,
  };
}

describe("ClaimTasks reports the cap that bounded it", () => {
  it("asked for 10 under the default max_concurrency: 1 claim, no free slot, cap 1", async () => {
    const { workerId } = await setUp(10);
    expect(await claim(workerId, 10)).toMatchObject({
      claims: 1,
      freeSlots: 0,
      maxConcurrency: 1,
    });
  });

  it("max_concurrency 0 is no limit: claims are bounded by max_tasks alone, with cap 0 and no free slots", async () => {
    const { workerId } = await setUp(30, 0);
    expect(await claim(workerId, 10)).toEqual({
      claims: 10,
      freeSlots: undefined,
      maxConcurrency: 0,
    });
    expect(await claim(workerId, 10)).toEqual({
      claims: 10,
      freeSlots: undefined,
      maxConcurrency: 0,
    });
    // A claim that states its own cap is bounded by it, as any other.
    expect(await claim(workerId, 10, { maxConcurrency: 25 })).toMatchObject({
      claims: 5,
      freeSlots: 0,
      maxConcurrency: 25,
    });
  });

  it("counts the slots left after the claims: cap 5 holding 2 asked for 10 gets 3 and 0 left", async () => {
    const { workerId } = await setUp(10, 5);
    expect(await claim(workerId, 2)).toMatchObject({ claims: 2, freeSlots: 3, maxConcurrency: 5 });
    expect(await claim(workerId, 10)).toMatchObject({ claims: 3, freeSlots: 0, maxConcurrency: 5 });
    expect(await claim(workerId, 10)).toMatchObject({ claims: 0, freeSlots: 0, maxConcurrency: 5 });
  });

  it("reports free slots on an empty claim, immediate or after a long poll", async () => {
    const { workerId } = await setUp(0, 4);
    expect(await claim(workerId, 10)).toMatchObject({ claims: 0, freeSlots: 4, maxConcurrency: 4 });
    expect(await claim(workerId, 10, { waitSeconds: 1 })).toMatchObject({
      claims: 0,
      freeSlots: 4,
      maxConcurrency: 4,
    });
  });

  it("after a long poll that a new task ends, counts the slots once that task is claimed", async () => {
    const { workerId, workload } = await setUp(0, 4);
    const polling = claim(workerId, 10, { waitSeconds: 10 });
    await new Promise((r) => setTimeout(r, 100));
    await h.tasks.createTask({ workload });
    expect(await polling).toMatchObject({ claims: 1, freeSlots: 3, maxConcurrency: 4 });
  });

  it("gives a slot back when a lease ends: completed or expired", async () => {
    const { workerId } = await setUp(3, 2);
    const first = await h.leases.claimTasks({ workerId, maxTasks: 2 });
    expect(first.freeSlots).toBe(0);
    const [a, b] = first.claims;
    if (!a || !b) throw new Error("expected two claims");
    await h.leases.completeTask({
      taskId: a.taskId,
      workerId,
      attempt: a.attempt,
      leaseToken: a.leaseToken,
    });
    await expireLease(h.app.database.db, b.taskId);
    expect(await claim(workerId, 0)).toMatchObject({ claims: 1, freeSlots: 1, maxConcurrency: 2 });
  });

  it("answers with the request's max_concurrency when it overrides the registered one", async () => {
    const { workerId } = await setUp(5);
    expect(await claim(workerId, 5, { maxConcurrency: 3 })).toMatchObject({
      claims: 3,
      freeSlots: 0,
      maxConcurrency: 3,
    });
    // Without the override the registered cap (1) applies: 3 live leases leave none.
    expect(await claim(workerId, 5)).toMatchObject({ claims: 0, freeSlots: 0, maxConcurrency: 1 });
    expect(await claim(workerId, 5, { maxConcurrency: 10 })).toMatchObject({
      claims: 2,
      freeSlots: 5,
      maxConcurrency: 10,
    });
  });

  it("counts the slots each claimed task asks: a task of 2 and one of 1 leave 2 of 5", async () => {
    const workload = uniqueWorkload();
    const { workerId } = await h.fleet.registerWorker({
      capabilities: [workload],
      maxConcurrency: 5,
    });
    await h.tasks.createTask({ workload, resources: { slots: 2n } });
    await h.tasks.createTask({ workload });
    expect(await claim(workerId, 5)).toMatchObject({ claims: 2, freeSlots: 2, maxConcurrency: 5 });
    expect(await claim(workerId, 5)).toMatchObject({ claims: 0, freeSlots: 2, maxConcurrency: 5 });
  });

  it("still reports the slots of a drained worker, which gets no claims", async () => {
    const { workerId } = await setUp(2, 3);
    await h.fleet.drainWorker({ workerId, drained: true });
    expect(await claim(workerId, 2)).toMatchObject({ claims: 0, freeSlots: 3, maxConcurrency: 3 });
  });

  it("answers concurrent claims of many workers (one statement for those that arrive together) each with its own tasks and slots", async () => {
    const workload = uniqueWorkload();
    const workers = await Promise.all(
      Array.from({ length: 12 }, () =>
        h.fleet.registerWorker({ capabilities: [workload], maxConcurrency: 2 }),
      ),
    );
    await h.tasks.createTasks({ tasks: Array.from({ length: 30 }, () => ({ workload })) });
    const answers = await Promise.all(
      workers.flatMap(({ workerId }) => [
        h.leases.claimTasks({ workerId, maxTasks: 5 }).then((res) => ({ workerId, res })),
        h.leases.claimTasks({ workerId, maxTasks: 1 }).then((res) => ({ workerId, res })),
      ]),
    );
    const leased = answers.flatMap(({ res }) => res.claims.map((c) => c.taskId));
    expect(new Set(leased).size).toBe(leased.length); // no task twice
    expect(leased).toHaveLength(24); // every worker at its cap of 2, 6 tasks left
    for (const { workerId } of workers) {
      const mine = answers.filter((a) => a.workerId === workerId);
      expect(mine.reduce((n, a) => n + a.res.claims.length, 0)).toBe(2);
      // The slots each answer reports are counted after its own claim: the
      // second of a worker's two claims says 0.
      const after = mine.map((a) => a.res.freeSlots).sort();
      expect(after[0]).toBe(0);
      for (const a of mine) expect(a.res.maxConcurrency).toBe(2);
    }
  });

  it("counts the slots in the claim's own statement: no second statement for a claim", async () => {
    const { workerId } = await setUp(1, 3);
    const count = vi.spyOn(h.app.leases, "slots");
    try {
      const leased = await h.leases.claimTasks({ workerId, maxTasks: 2 });
      expect(leased.claims).toHaveLength(1);
      expect(leased.freeSlots).toBe(2);
      const empty = await h.leases.claimTasks({ workerId, maxTasks: 2 });
      expect(empty.claims).toHaveLength(0);
      expect(empty.freeSlots).toBe(2);
      expect(count).not.toHaveBeenCalled();
    } finally {
      count.mockRestore();
    }
  });

  it("answers the claims it leased even when the count after them fails, without free_slots", async () => {
    const { workerId } = await setUp(1, 2);
    // A claim answered without its count (as for a worker the statement did
    // not find), and the separate count then failing.
    const claimCounted = h.app.leases.claimCounted.bind(h.app.leases);
    const uncounted = vi
      .spyOn(h.app.leases, "claimCounted")
      .mockImplementation(async (worker, max) => ({
        rows: (await claimCounted(worker, max)).rows,
        slots: undefined,
      }));
    const count = vi.spyOn(h.app.leases, "slots").mockRejectedValue(new Error("connection lost"));
    try {
      const res = await h.leases.claimTasks({ workerId, maxTasks: 2 });
      expect(res.claims).toHaveLength(1);
      expect(res.freeSlots).toBeUndefined();
      expect(res.maxConcurrency).toBe(2);
      // Nothing leased: the failure is the answer.
      expect(await outcome(h.leases.claimTasks({ workerId, maxTasks: 2 }))).toMatchObject({
        code: "Internal",
      });
    } finally {
      count.mockRestore();
      uncounted.mockRestore();
    }
  });
});
