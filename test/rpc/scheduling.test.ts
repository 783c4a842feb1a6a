import { createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConcurrencyService } from "../../gen/meshwork/v1/concurrency_pb.js";
import { Operator, TaskState, WaitKind } from "../../gen/meshwork/v1/task_pb.js";
import { until, within } from "../support/bounded.js";
import { outcome } from "../support/errors.js";
import { expireLease } from "../support/fixtures.js";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

// Resources, selectors, limits and the waiting reasons through the real
// handlers (docs/scheduling.md), on the engine of the run.

let h: Harness;
let limits: ReturnType<typeof createClient<typeof ConcurrencyService>>;
beforeAll(async () => {
  h = await createHarness();
  limits = createClient(ConcurrencyService, h.transport);
});
afterAll(() => h.close());

const gpuWorker = async (workload: string, gpus: number, extra: Record<string, unknown> = {}) =>
  (
    await h.fleet.registerWorker({
      name: `gpu-${gpus}`,
      capabilities: [workload],
      maxConcurrency: 10,
      cpuCount: 8,
      memoryMb: 32_768n,
      capacity: { gpu: BigInt(gpus) },
      ...extra,
    })
  ).workerId;

const waitingKinds = async (taskId: string) =>
  (await h.tasks.getTask({ taskId })).waiting.map((w) => w.kind);

describe("resources", () => {
  it("a worker's capacity counts cpu_count, memory_mb and max_concurrency, and what its leases hold", async () => {
    const workload = uniqueWorkload();
    const workerId = await gpuWorker(workload, 4);
    const { worker } = await h.fleet.getWorker({ workerId });
    expect(worker?.capacity).toEqual({ cpu: 8000n, memory: 32_768n, gpu: 4n, slots: 10n });
    expect(worker?.allocated).toEqual({});
    await h.tasks.createTask({ workload, resources: { gpu: 2n, cpu: 1500n } });
    await h.leases.claimTasks({ workerId, maxTasks: 5 });
    const after = await h.fleet.getWorker({ workerId });
    expect(after.worker?.allocated).toEqual({ gpu: 2n, cpu: 1500n, slots: 1n });
  });

  it("a claim of N packs as many as fit, in order, and never more than the capacity", async () => {
    const workload = uniqueWorkload();
    const workerId = await gpuWorker(workload, 4);
    const made = [];
    for (const gpu of [2n, 3n, 2n, 1n, 1n]) {
      made.push((await h.tasks.createTask({ workload, resources: { gpu } })).task?.taskId);
    }
    const { claims, freeSlots } = await h.leases.claimTasks({ workerId, maxTasks: 10 });
    // 2 fits, 3 does not (2 left), the second 2 fits; nothing is left for the 1s.
    expect(claims.map((c) => c.taskId)).toEqual([made[0], made[2]]);
    expect(freeSlots).toBe(8);
    expect((await h.leases.claimTasks({ workerId, maxTasks: 10 })).claims).toEqual([]);
    // One lease ends: 2 GPUs free again, the 3-GPU task still does not fit, two 1s do.
    const first = claims[0];
    if (!first) throw new Error("no claim");
    await h.leases.completeTask({ taskId: first.taskId, workerId, attempt: 1 });
    const next = await h.leases.claimTasks({ workerId, maxTasks: 10 });
    expect(next.claims.map((c) => c.taskId)).toEqual([made[3], made[4]]);
    expect((await h.fleet.getWorker({ workerId })).worker?.allocated.gpu).toBe(4n);
  });

  it("a task without resources takes one slot, as before", async () => {
    const workload = uniqueWorkload();
    const workerId = (await h.fleet.registerWorker({ capabilities: [workload], maxConcurrency: 2 }))
      .workerId;
    const { task } = await h.tasks.createTask({ workload });
    expect(task?.resources).toEqual({ slots: 1n });
    await h.tasks.createTasks({ tasks: [{ workload }, { workload }] });
    const { claims, freeSlots, maxConcurrency } = await h.leases.claimTasks({
      workerId,
      maxTasks: 10,
    });
    expect({ n: claims.length, freeSlots, maxConcurrency }).toEqual({
      n: 2,
      freeSlots: 0,
      maxConcurrency: 2,
    });
  });

  it("refuses bad resources and capacities with invalid_argument, creating nothing", async () => {
    const workload = uniqueWorkload();
    const bad: Record<string, bigint>[] = [
      { "Bad Name": 1n },
      { gpu: -1n },
      { gpu: 10n ** 16n },
      { slots: 0n },
    ];
    for (const resources of bad) {
      expect((await outcome(h.tasks.createTask({ workload, resources }))).code).toBe(
        "InvalidArgument",
      );
    }
    expect(
      (await outcome(h.fleet.registerWorker({ capacity: { slots: 3n }, maxConcurrency: 4 }))).code,
    ).toBe("InvalidArgument");
    expect((await h.tasks.listTasks({ workload })).tasks).toEqual([]);
  });
});

describe("selectors", () => {
  it("a claim takes a task only when the worker's labels meet every requirement", async () => {
    const workload = uniqueWorkload();
    const worker = (labels: Record<string, string>) =>
      h.fleet
        .registerWorker({ capabilities: [workload], labels, maxConcurrency: 10 })
        .then((r) => r.workerId);
    const a100 = await worker({ model: "a100", cores: "64", zone: "eu" });
    const t4 = await worker({ model: "t4", cores: "8", spot: "yes" });
    const req = (key: string, operator: Operator, values: string[] = []) => ({
      key,
      operator,
      values,
    });
    const shapes = [
      [req("model", Operator.IN, ["a100", "h100"])],
      [req("model", Operator.NOT_IN, ["a100"])],
      [req("spot", Operator.EXISTS)],
      [req("spot", Operator.DOES_NOT_EXIST)],
      [req("cores", Operator.GT, ["16"])],
      [req("cores", Operator.LT, ["16"])],
      [req("zone", Operator.IN, ["eu"]), req("cores", Operator.GT, ["100"])],
    ];
    const ids = [];
    for (const requirements of shapes) {
      ids.push((await h.tasks.createTask({ workload, requirements })).task?.taskId);
    }
    const take = async (workerId: string) =>
      (await h.leases.claimTasks({ workerId, maxTasks: 10 })).claims.map((c) => c.taskId).sort();
    expect(await take(a100)).toEqual([ids[0], ids[3], ids[4]].sort());
    expect(await take(t4)).toEqual([ids[1], ids[2], ids[5]].sort());
    // Nobody meets both of the last one's requirements: it says so.
    const last = ids[6] ?? "";
    const [why] = (await h.tasks.getTask({ taskId: last })).waiting;
    expect(why?.kind).toBe(WaitKind.NO_MATCHING_WORKER);
    expect(why?.message).toContain("requirement cores > 100");
  });

  it("refuses malformed requirements and preferences", async () => {
    const workload = uniqueWorkload();
    for (const requirements of [
      [{ key: "a", operator: Operator.UNSPECIFIED, values: [] }],
      [{ key: "a", operator: Operator.IN, values: [] }],
      [{ key: "a", operator: Operator.EXISTS, values: ["x"] }],
      [{ key: "a", operator: Operator.GT, values: ["x"] }],
      [{ key: "", operator: Operator.EXISTS, values: [] }],
    ]) {
      expect((await outcome(h.tasks.createTask({ workload, requirements }))).code).toBe(
        "InvalidArgument",
      );
    }
    const requirement = { key: "a", operator: Operator.EXISTS, values: [] };
    expect(
      (await outcome(h.tasks.createTask({ workload, preferences: [{ weight: 0, requirement }] })))
        .code,
    ).toBe("InvalidArgument");
  });

  it("push placement ranks the workers that fit by their preference score first", async () => {
    const workload = uniqueWorkload();
    const url = "http://w.example:8080/";
    const plain = await h.fleet.registerWorker({
      capabilities: [workload],
      apiBaseUrl: url,
      maxConcurrency: 5,
    });
    const ssd = await h.fleet.registerWorker({
      capabilities: [workload],
      labels: { disk: "ssd" },
      apiBaseUrl: url,
      maxConcurrency: 1,
    });
    const prefer = {
      weight: 50,
      requirement: { key: "disk", operator: Operator.IN, values: ["ssd"] },
    };
    const { task } = await h.tasks.createTask({ workload, preferences: [prefer] });
    const placed = await h.tasks.scheduleTask({ taskId: task?.taskId ?? "" });
    // The ssd worker has fewer free slots, but meets the preference.
    expect(placed.task?.assignedWorkerId).toBe(ssd.workerId);
    const { task: other } = await h.tasks.createTask({ workload, preferences: [prefer] });
    // Now it is full: the other worker takes it.
    expect(
      (await h.tasks.scheduleTask({ taskId: other?.taskId ?? "" })).task?.assignedWorkerId,
    ).toBe(plain.workerId);
  });

  it("a pull claim takes the tasks whose preferences it meets before those that prefer others", async () => {
    const workload = uniqueWorkload();
    const workerId = (
      await h.fleet.registerWorker({
        capabilities: [workload],
        labels: { disk: "hdd" },
        maxConcurrency: 1,
      })
    ).workerId;
    const wantsSsd = await h.tasks.createTask({
      workload,
      preferences: [
        { weight: 10, requirement: { key: "disk", operator: Operator.IN, values: ["ssd"] } },
      ],
    });
    const plain = await h.tasks.createTask({ workload });
    const { claims } = await h.leases.claimTasks({ workerId, maxTasks: 1 });
    expect(claims.map((c) => c.taskId)).toEqual([plain.task?.taskId]);
    expect(wantsSsd.task?.taskId).not.toBe(plain.task?.taskId);
  });
});

describe("concurrency limits", () => {
  const keyed = async (workload: string, key: string, n: number) =>
    (
      await h.tasks.createTasks({
        tasks: Array.from({ length: n }, () => ({ workload, concurrencyKey: key })),
      })
    ).tasks.map((t) => t.taskId);

  it("holds how many run at once, gives a slot back on every way a lease ends, and says why a task waits", async () => {
    const workload = uniqueWorkload();
    const key = `licence-${workload}`;
    await limits.setLimit({ key, maxRunning: 2 });
    const ids = await keyed(workload, key, 8);
    const workerId = (
      await h.fleet.registerWorker({ capabilities: [workload], maxConcurrency: 20 })
    ).workerId;
    const claim = async () => (await h.leases.claimTasks({ workerId, maxTasks: 20 })).claims;
    const [a, b] = await claim();
    expect(await claim()).toEqual([]);
    const waiting = ids.find((id) => id !== a?.taskId && id !== b?.taskId) ?? "";
    expect(await waitingKinds(waiting)).toContain(WaitKind.CONCURRENCY_LIMIT);
    const { limits: listed } = await limits.listLimits({});
    expect(listed.find((l) => l.key === key)).toMatchObject({
      maxRunning: 2,
      running: 2,
      pending: 6n,
    });
    if (!a || !b) throw new Error("two claims expected");
    type Held = typeof a;
    const lease = (c: Held) => ({ taskId: c.taskId, workerId, attempt: c.attempt });

    // Each way a lease ends frees its slot for the next claim.
    const ends: [string, (c: Held) => Promise<unknown>][] = [
      ["completion", (c) => h.leases.completeTask(lease(c))],
      ["failure", (c) => h.leases.failTask({ ...lease(c), errorCode: "X", retryable: false })],
      ["release", (c) => h.leases.releaseTask(lease(c))],
      ["cancellation", (c) => h.tasks.cancelTask({ taskId: c.taskId })],
      [
        "expiry",
        async (c) => {
          await expireLease(h.app.database.db, c.taskId);
          await h.app.sweeper.runOnce();
        },
      ],
    ];
    let held: Held[] = [a, b];
    for (const [how, end] of ends) {
      const [first, ...rest] = held;
      if (!first) throw new Error("nothing held");
      await end(first);
      const got = await claim();
      expect({ how, n: got.length }).toEqual({ how, n: 1 });
      held = [...rest, ...got];
    }
    // Deregistering the worker releases its leases: the next worker gets two.
    await h.fleet.deregisterWorker({ workerId });
    const next = (await h.fleet.registerWorker({ capabilities: [workload], maxConcurrency: 20 }))
      .workerId;
    expect((await h.leases.claimTasks({ workerId: next, maxTasks: 20 })).claims).toHaveLength(2);
  });

  it("refuses a blank or padded key on a task and on a limit, creating nothing", async () => {
    const workload = uniqueWorkload();
    for (const fields of [
      { concurrencyKey: " " },
      { rateKey: " api" },
      { concurrencyKey: "x\t" },
    ]) {
      expect((await outcome(h.tasks.createTask({ workload, ...fields }))).code).toBe(
        "InvalidArgument",
      );
    }
    expect((await h.tasks.listTasks({ workload })).tasks).toEqual([]);
    expect((await outcome(limits.setLimit({ key: " ", maxRunning: 1 }))).code).toBe(
      "InvalidArgument",
    );
    expect((await outcome(limits.setRate({ key: "a ", perSecond: 1 }))).code).toBe(
      "InvalidArgument",
    );
  });

  it("lists limits and rates by key, a page at a time", async () => {
    const prefix = `page-${uniqueWorkload()}`;
    const keys = ["c", "a", "b"].map((k) => `${prefix}-${k}`);
    for (const key of keys) {
      await limits.setLimit({ key, maxRunning: 3 });
      await limits.setRate({ key, perSecond: 2 });
    }
    const walk = async (
      read: (pageToken: string) => Promise<{ keys: string[]; next: string }>,
    ): Promise<string[]> => {
      const out: string[] = [];
      let pageToken = "";
      for (let pages = 0; pages < 100; pages++) {
        const page = await read(pageToken);
        expect(page.keys.length).toBeLessThanOrEqual(2);
        out.push(...page.keys);
        pageToken = page.next;
        if (!pageToken) break;
      }
      return out.filter((k) => k.startsWith(prefix));
    };
    const sorted = [...keys].sort();
    expect(
      await walk(async (pageToken) => {
        const r = await limits.listLimits({ pageSize: 2, pageToken });
        return { keys: r.limits.map((l) => l.key), next: r.nextPageToken };
      }),
    ).toEqual(sorted);
    expect(
      await walk(async (pageToken) => {
        const r = await limits.listRates({ pageSize: 2, pageToken });
        return { keys: r.rates.map((l) => l.key), next: r.nextPageToken };
      }),
    ).toEqual(sorted);
  });

  it("a placement over the limit is resource_exhausted and changes nothing", async () => {
    const workload = uniqueWorkload();
    const key = `k-${workload}`;
    await limits.setLimit({ key, maxRunning: 1 });
    const [one, two] = await keyed(workload, key, 2);
    await h.fleet.registerWorker({
      capabilities: [workload],
      apiBaseUrl: "http://w.example/",
      maxConcurrency: 5,
    });
    await h.tasks.scheduleTask({ taskId: one ?? "" });
    expect(await outcome(h.tasks.scheduleTask({ taskId: two ?? "" }))).toMatchObject({
      code: "ResourceExhausted",
      reason: "CONCURRENCY_LIMIT",
    });
    expect((await h.tasks.getTask({ taskId: two ?? "" })).task?.state).toBe(TaskState.PENDING);
  });

  it("a rate grants at most its burst at once, then a token per 1/per_second", async () => {
    const workload = uniqueWorkload();
    const key = `api-${workload}`;
    const set = await limits.setRate({ key, perSecond: 0.001, burst: 3 });
    expect(set.rate).toMatchObject({ key, perSecond: 0.001, burst: 3 });
    const ids = (
      await h.tasks.createTasks({
        tasks: Array.from({ length: 5 }, () => ({ workload, rateKey: key })),
      })
    ).tasks.map((t) => t.taskId);
    const workerId = (
      await h.fleet.registerWorker({ capabilities: [workload], maxConcurrency: 20 })
    ).workerId;
    const { claims } = await h.leases.claimTasks({ workerId, maxTasks: 20 });
    expect(claims).toHaveLength(3);
    // Tasks made together tie on the claim order: whichever two were left wait for the rate.
    const left = ids.filter((id) => !claims.some((c) => c.taskId === id));
    expect(left).toHaveLength(2);
    for (const id of left) expect(await waitingKinds(id)).toContain(WaitKind.RATE_LIMIT);
    // A faster rate refills at once.
    await limits.setRate({ key, perSecond: 1_000_000, burst: 2 });
    expect((await h.leases.claimTasks({ workerId, maxTasks: 20 })).claims).toHaveLength(2);
  });
});

describe("why a task waits", () => {
  it("names a retry's not_before, a worker too small, and capacity taken, with its place in its share", async () => {
    const workload = uniqueWorkload();
    const share = `why/${workload}`;
    const workerId = await gpuWorker(workload, 2);
    const big = (await h.tasks.createTask({ workload, share, resources: { gpu: 4n } })).task;
    const [kind] = await waitingKinds(big?.taskId ?? "");
    expect(kind).toBe(WaitKind.NO_CAPACITY);
    expect((await h.tasks.getTask({ taskId: big?.taskId ?? "" })).waiting[0]?.message).toContain(
      "large enough",
    );
    const two = (await h.tasks.createTask({ workload, share, resources: { gpu: 2n } })).task;
    const three = (await h.tasks.createTask({ workload, share, resources: { gpu: 2n } })).task;
    const got = await h.tasks.getTask({ taskId: three?.taskId ?? "" });
    expect(got.queuePosition).toBe(3);
    expect(got.waiting).toEqual([]);
    await h.leases.claimTasks({ workerId, maxTasks: 5 });
    const now = await h.tasks.getTask({ taskId: three?.taskId ?? "" });
    expect(now.waiting.map((w) => w.kind)).toEqual([WaitKind.NO_CAPACITY]);
    expect(now.waiting[0]?.detail.gpu).toBe(0n);
    expect(now.queuePosition).toBe(2);
    // A failed attempt waits out its backoff.
    await h.leases.failTask({ taskId: two?.taskId ?? "", workerId, attempt: 1, errorCode: "X" });
    expect(await waitingKinds(two?.taskId ?? "")).toContain(WaitKind.NOT_BEFORE);
    expect((await h.tasks.getTask({ taskId: big?.taskId ?? "" })).task?.state).toBe(
      TaskState.PENDING,
    );
  });

  it("places the tasks of one CreateTasks call in its share's queue in the order they were sent", async () => {
    // One call's tasks share their created_at: their places go by id, as the claim takes them.
    const workload = uniqueWorkload();
    const share = `batch/${workload}`;
    const { tasks } = await h.tasks.createTasks({
      tasks: Array.from({ length: 4 }, () => ({ workload, share })),
    });
    const places = [];
    for (const t of tasks) places.push((await h.tasks.getTask({ taskId: t.taskId })).queuePosition);
    expect(places).toEqual([1, 2, 3, 4]);
  });

  it("a task that is not PENDING waits for nothing", async () => {
    const workload = uniqueWorkload();
    const workerId = await gpuWorker(workload, 1);
    const { task } = await h.tasks.createTask({ workload });
    await h.leases.claimTasks({ workerId });
    expect(await h.tasks.getTask({ taskId: task?.taskId ?? "" })).toMatchObject({
      waiting: [],
      queuePosition: 0,
    });
  });
});

// A harness of its own: any other change that wakes parked claims would
// hide a missing wake-up here.
describe("long polls wake when a limit lets a task go", () => {
  let w: Harness;
  let wLimits: ReturnType<typeof createClient<typeof ConcurrencyService>>;
  beforeAll(async () => {
    w = await createHarness();
    wLimits = createClient(ConcurrencyService, w.transport);
  });
  afterAll(() => w.close());

  it("when a lease under a concurrency limit ends, and when a rate's bucket refills", async () => {
    const workload = uniqueWorkload();
    const key = `k-${workload}`;
    await wLimits.setLimit({ key, maxRunning: 1 });
    await w.tasks.createTasks({
      tasks: [
        { workload, concurrencyKey: key },
        { workload, concurrencyKey: key },
      ],
    });
    const first = (await w.fleet.registerWorker({ capabilities: [workload], maxConcurrency: 5 }))
      .workerId;
    const second = (await w.fleet.registerWorker({ capabilities: [workload], maxConcurrency: 5 }))
      .workerId;
    const [held] = (await w.leases.claimTasks({ workerId: first, maxTasks: 5 })).claims;
    const polling = w.leases.claimTasks({ workerId: second, maxTasks: 5, waitSeconds: 25 });
    await until(() => w.app.wakeups.parked() >= 1);
    await w.leases.completeTask({ taskId: held?.taskId ?? "", workerId: first, attempt: 1 });
    // A bound well inside wait_seconds: a missing wake-up fails here.
    const got = await within(10_000, polling);
    expect(got === "timed out" ? got : got.claims.length).toBe(1);

    const rated = uniqueWorkload();
    const rateKey = `r-${rated}`;
    await wLimits.setRate({ key: rateKey, perSecond: 4, burst: 1 });
    await w.tasks.createTasks({
      tasks: [
        { workload: rated, rateKey },
        { workload: rated, rateKey },
      ],
    });
    const third = (await w.fleet.registerWorker({ capabilities: [rated], maxConcurrency: 5 }))
      .workerId;
    expect((await w.leases.claimTasks({ workerId: third, maxTasks: 5 })).claims).toHaveLength(1);
    const waiting = w.leases.claimTasks({ workerId: third, maxTasks: 5, waitSeconds: 25 });
    await until(() => w.app.wakeups.parked() >= 1);
    // A token comes back after 250 ms; the sweeper wakes the claim for it.
    await new Promise((r) => setTimeout(r, 400));
    await w.app.sweeper.runOnce();
    const refilled = await within(10_000, waiting);
    expect(refilled === "timed out" ? refilled : refilled.claims.length).toBe(1);
  });
});
