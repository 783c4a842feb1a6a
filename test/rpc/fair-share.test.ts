import { createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConcurrencyService } from "../../gen/meshwork/v1/concurrency_pb.js";
import type { Claim } from "../../gen/meshwork/v1/lease_pb.js";
import { ShareService } from "../../gen/meshwork/v1/share_pb.js";
import { WaitKind } from "../../gen/meshwork/v1/task_pb.js";
import { outcome } from "../support/errors.js";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

// Fair share and reservations, driven step by step: a step is one unit of
// a task's running time. In each step every worker ends the leases whose
// time is up and claims to fill what it has free; the share book reads the
// tables first (as its timer does every second). What each share's leases
// held, step by step, is its running resource-seconds.

interface Sim {
  h: Harness;
  workload: string;
  workers: string[];
  /** Running per worker: the claim and the step it ends at. */
  running: Map<string, { claim: Claim; share: string; until: number }[]>;
}

/** Registers `n` workers of `gpus` GPUs each (and slots enough) for a new workload. */
async function fleet(h: Harness, n: number, gpus: number): Promise<Sim> {
  const workload = uniqueWorkload("fair");
  const workers = [];
  for (let i = 0; i < n; i++) {
    const { workerId } = await h.fleet.registerWorker({
      name: `w${i}`,
      capabilities: [workload],
      maxConcurrency: 64,
      capacity: { gpu: BigInt(gpus) },
    });
    workers.push(workerId);
  }
  return { h, workload, workers, running: new Map(workers.map((w) => [w, []])) };
}

/** Queues `n` one-GPU tasks in `share`. */
async function backlog(sim: Sim, share: string, n: number): Promise<void> {
  for (let left = n; left > 0; left -= 500) {
    await sim.h.tasks.createTasks({
      tasks: Array.from({ length: Math.min(500, left) }, () => ({
        workload: sim.workload,
        share,
        resources: { gpu: 1n },
      })),
    });
  }
}

/** One step: leases that ran `duration` steps complete, then every worker claims. Returns GPUs held per share after it. */
async function step(sim: Sim, now: number, duration: number, shareOf: Map<string, string>) {
  await sim.h.app.shareBook.refresh();
  for (const workerId of sim.workers) {
    const held = sim.running.get(workerId) ?? [];
    for (const r of held.filter((r) => r.until <= now)) {
      await sim.h.leases.completeTask({
        taskId: r.claim.taskId,
        workerId,
        attempt: r.claim.attempt,
      });
    }
    const kept = held.filter((r) => r.until > now);
    const { claims } = await sim.h.leases.claimTasks({ workerId, maxTasks: 64 });
    for (const claim of claims) {
      kept.push({ claim, share: shareOf.get(claim.taskId) ?? "?", until: now + duration });
    }
    sim.running.set(workerId, kept);
  }
  const held = new Map<string, number>();
  for (const list of sim.running.values()) {
    for (const r of list) held.set(r.share, (held.get(r.share) ?? 0) + 1);
  }
  return held;
}

async function shareOfTasks(sim: Sim): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  let pageToken = "";
  do {
    const page = await sim.h.tasks.listTasks({ workload: sim.workload, pageSize: 1000, pageToken });
    for (const t of page.tasks) out.set(t.taskId, t.share);
    pageToken = page.nextPageToken;
  } while (pageToken);
  return out;
}

describe("fair share", () => {
  let h: Harness;
  let shares: ReturnType<typeof createClient<typeof ShareService>>;
  beforeAll(async () => {
    h = await createHarness();
    shares = createClient(ShareService, h.transport);
  });
  afterAll(() => h.close());

  it("three saturated shares weighted 1:2:1 hold 25/50/25 % of the GPU-seconds; a late one reaches its part", async () => {
    const sim = await fleet(h, 4, 4); // 16 GPUs
    const [a, b, c] = ["lab/a", "lab/b", "lab/c"].map((s) => `${s}-${sim.workload}`);
    if (!a || !b || !c) throw new Error("three shares");
    await shares.setShare({ path: b, weight: 2 });
    await backlog(sim, a, 150);
    await backlog(sim, b, 250);
    let shareOf = await shareOfTasks(sim);
    // First a and b alone (1:2), then c arrives.
    for (let t = 0; t < 12; t++) await step(sim, t, 3, shareOf);
    await backlog(sim, c, 150);
    shareOf = await shareOfTasks(sim);
    const reached: number[] = [];
    const totals = new Map<string, number>();
    for (let t = 12; t < 48; t++) {
      const held = await step(sim, t, 3, shareOf);
      if ((held.get(c) ?? 0) >= 0.2 * 16) reached.push(t);
      // Measured once c has had one task duration to get in.
      if (t >= 15) for (const [s, n] of held) totals.set(s, (totals.get(s) ?? 0) + n);
    }
    // c held its 25 % (±5 points) within two task durations of arriving.
    expect(reached[0]).toBeLessThanOrEqual(12 + 6);
    const all = [...totals.values()].reduce((x, y) => x + y, 0);
    const part = (s: string) => Math.round((1000 * (totals.get(s) ?? 0)) / all) / 10;
    const parts = { a: part(a), b: part(b), c: part(c) };
    expect(Math.abs(parts.a - 25), JSON.stringify(parts)).toBeLessThanOrEqual(5);
    expect(Math.abs(parts.b - 50), JSON.stringify(parts)).toBeLessThanOrEqual(5);
    expect(Math.abs(parts.c - 25), JSON.stringify(parts)).toBeLessThanOrEqual(5);
    // The fleet stayed full the whole time (work-conserving).
    expect(all).toBe(16 * (48 - 15));

    // ListShares shows the weights and entitlements, parents first.
    const listed = (await shares.listShares({})).shares.filter((s) => s.path.startsWith("lab"));
    const byPath = new Map(listed.map((s) => [s.path, s]));
    expect(listed[0]?.path).toBe("lab");
    expect(byPath.get(b)?.weight).toBe(2);
    expect(byPath.get(a)?.entitlement).toBeCloseTo(0.25, 5);
    expect(byPath.get(b)?.entitlement).toBeCloseTo(0.5, 5);
    // And what each holds now: within a task of its part.
    expect(byPath.get(a)?.allocation).toBeCloseTo(0.25, 1);
    expect(byPath.get(b)?.allocation).toBeCloseTo(0.5, 1);
    expect(byPath.get(c)?.allocation).toBeCloseTo(0.25, 1);
    expect(Number(byPath.get("lab")?.running)).toBe(16);
    // /metrics carries the same, from the share book.
    await h.app.shareBook.refresh();
    const scraped = await h.app.metrics.scrape();
    expect(scraped).toContain(`meshwork_share_entitlement{share="${b}"} 0.5`);
    expect(scraped).toMatch(new RegExp(`meshwork_share_allocation\\{share="${a}"\\} 0\\.2`));
  });

  it("a share alone gets the whole fleet, and a share above its part says so while another waits", async () => {
    const h2 = await createHarness();
    try {
      const sim = await fleet(h2, 2, 4); // 8 GPUs
      const alone = `alone-${sim.workload}`;
      await backlog(sim, alone, 40);
      let shareOf = await shareOfTasks(sim);
      let held = new Map<string, number>();
      for (let t = 0; t < 3; t++) held = await step(sim, t, 100, shareOf);
      expect(held.get(alone)).toBe(8);
      // Another share arrives while `alone` holds everything: its tasks
      // wait for capacity; `alone`'s wait because it is over its part.
      const late = `late-${sim.workload}`;
      await backlog(sim, late, 4);
      shareOf = await shareOfTasks(sim);
      await h2.app.shareBook.refresh();
      const pendingOf = (s: string) =>
        [...shareOf].find(
          ([id, sh]) =>
            sh === s && ![...sim.running.values()].flat().some((r) => r.claim.taskId === id),
        )?.[0] ?? "";
      const why = (await h2.tasks.getTask({ taskId: pendingOf(alone) })).waiting.map((w) => w.kind);
      expect(why).toContain(WaitKind.SHARE_OVER_ENTITLEMENT);
      expect(why).toContain(WaitKind.NO_CAPACITY);
    } finally {
      await h2.close();
    }
  });
});

describe("the share tree's listing", () => {
  it("lists parents before their children, depth first, siblings by path, a page at a time", async () => {
    const h = await createHarness();
    try {
      const shares = createClient(ShareService, h.transport);
      const workload = uniqueWorkload();
      // By text alone, `lab-x` would stand between `lab` and its children.
      for (const share of ["lab/b", "lab-x", "lab/a/deep", "lab/a", "zoo"]) {
        await h.tasks.createTask({ workload, share });
      }
      await shares.setShare({ path: "lab", weight: 2 });
      const whole = await shares.listShares({});
      const paths = whole.shares.map((s) => s.path);
      expect(paths).toEqual(["lab", "lab/a", "lab/a/deep", "lab/b", "lab-x", "zoo"]);
      expect(whole.nextPageToken).toBe("");
      // Page by page, the same nodes in the same order.
      const paged: string[] = [];
      let pageToken = "";
      let pages = 0;
      do {
        const page = await shares.listShares({ pageSize: 2, pageToken });
        expect(page.shares.length).toBeLessThanOrEqual(2);
        paged.push(...page.shares.map((s) => s.path));
        pageToken = page.nextPageToken;
        pages++;
      } while (pageToken && pages < 10);
      expect(paged).toEqual(paths);
      expect(pages).toBe(3);
      expect((await outcome(shares.listShares({ pageSize: 1001 }))).code).toBe("InvalidArgument");
      expect((await outcome(shares.listShares({ pageToken: "nonsense" }))).reason).toBe(
        "INVALID_PAGE_TOKEN",
      );
    } finally {
      await h.close();
    }
  });
});

describe("reservations", () => {
  /** A worker of 4 GPUs busy with 1-GPU tasks, a 4-GPU task, and a new 1-GPU task every step. */
  async function starve(reserveAfterMs: number) {
    const h = await createHarness({ reserveAfterMs });
    try {
      const sim = await fleet(h, 1, 4);
      const [workerId] = sim.workers;
      if (!workerId) throw new Error("no worker");
      await backlog(sim, "small", 4);
      const shareOf = await shareOfTasks(sim);
      await step(sim, 0, 4, shareOf);
      const { task: big } = await h.tasks.createTask({
        workload: sim.workload,
        share: "small",
        resources: { gpu: 4n },
      });
      let ranAt: number | undefined;
      let reservedSeen = false;
      for (let t = 1; t < 16 && ranAt === undefined; t++) {
        await backlog(sim, "small", 1);
        // One small task ends each step, so that a GPU frees every step.
        const held = sim.running.get(workerId) ?? [];
        const [oldest] = held;
        if (oldest) oldest.until = t;
        const map = await shareOfTasks(sim);
        map.set(big?.taskId ?? "", "big");
        await step(sim, t, 4, map);
        const { worker } = await h.fleet.getWorker({ workerId });
        if (worker?.reservedTaskId === big?.taskId) reservedSeen = true;
        if ((sim.running.get(workerId) ?? []).some((r) => r.claim.taskId === big?.taskId))
          ranAt = t;
      }
      return { ranAt, reservedSeen };
    } finally {
      await h.close();
    }
  }

  it("is neither made nor kept for a task its concurrency limit holds back", async () => {
    const h = await createHarness({ reserveAfterMs: 1 });
    try {
      const limits = createClient(ConcurrencyService, h.transport);
      const sim = await fleet(h, 1, 4);
      const [workerId] = sim.workers;
      if (!workerId) throw new Error("no worker");
      const reservedFor = async () =>
        (await h.fleet.getWorker({ workerId })).worker?.reservedTaskId;
      const claim = async () =>
        (await h.leases.claimTasks({ workerId, maxTasks: 10 })).claims.length;
      await backlog(sim, "small", 1);
      expect(await claim()).toBe(1); // 3 of 4 GPUs free
      const key = `licence-${sim.workload}`;
      await limits.setLimit({ key, maxRunning: 0 });
      const { task: big } = await h.tasks.createTask({
        workload: sim.workload,
        share: "big",
        resources: { gpu: 4n },
        concurrencyKey: key,
      });
      await new Promise((resolve) => setTimeout(resolve, 20));
      expect(await claim()).toBe(0);
      expect(await reservedFor()).toBe("");
      // Once its limit lets it run, it is reserved like any large task...
      await limits.setLimit({ key, maxRunning: 1 });
      expect(await claim()).toBe(0);
      expect(await reservedFor()).toBe(big?.taskId);
      // ...and when the limit holds it back again, the reservation goes and
      // small tasks get the free GPUs rather than wait behind it.
      await limits.setLimit({ key, maxRunning: 0 });
      await backlog(sim, "small", 3);
      expect(await claim()).toBe(3);
      expect(await reservedFor()).toBe("");
    } finally {
      await h.close();
    }
  });

  it("shows a worker's reservation only while its task waits (another worker may take it)", async () => {
    const h = await createHarness({ reserveAfterMs: 1 });
    try {
      const sim = await fleet(h, 1, 4);
      const [held] = sim.workers;
      if (!held) throw new Error("no worker");
      await backlog(sim, "small", 1);
      await h.leases.claimTasks({ workerId: held, maxTasks: 10 });
      const { task: big } = await h.tasks.createTask({
        workload: sim.workload,
        resources: { gpu: 4n },
      });
      await new Promise((resolve) => setTimeout(resolve, 20));
      await h.leases.claimTasks({ workerId: held, maxTasks: 10 });
      const reservedOf = async (workerId: string) =>
        (await h.fleet.getWorker({ workerId })).worker?.reservedTaskId;
      expect(await reservedOf(held)).toBe(big?.taskId);
      // Both wait on the reservation: the large task for the worker to free
      // up, a small one because what is free is held for the large one.
      const { task: small } = await h.tasks.createTask({
        workload: sim.workload,
        resources: { gpu: 1n },
      });
      for (const t of [big, small]) {
        const { waiting } = await h.tasks.getTask({ taskId: t?.taskId ?? "" });
        expect(waiting.map((w) => w.kind)).toContain(WaitKind.RESERVED);
      }
      const { workerId: other } = await h.fleet.registerWorker({
        capabilities: [sim.workload],
        maxConcurrency: 4,
        capacity: { gpu: 4n },
      });
      const { claims } = await h.leases.claimTasks({ workerId: other, maxTasks: 1 });
      expect(claims.map((c) => c.taskId)).toEqual([big?.taskId]);
      expect(await reservedOf(held)).toBe("");
    } finally {
      await h.close();
    }
  });

  it("a large task losing to smaller ones gets the worker reserved and runs within the bound", async () => {
    const reserved = await starve(1);
    expect(reserved.reservedSeen).toBe(true);
    // Reserved at its first claim; the four small tasks drain in four steps.
    expect(reserved.ranAt).toBeLessThanOrEqual(6);
    // Without reservations, the small tasks keep it out for as long as they come.
    const starved = await starve(0);
    expect(starved).toEqual({ ranAt: undefined, reservedSeen: false });
  });
});
