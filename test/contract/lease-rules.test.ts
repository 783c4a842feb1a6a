import { randomUUID } from "node:crypto";
import { count, eq, sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectPostgres } from "../../src/db/postgres-client.js";
import { type ArtifactRefJson, artifacts, tasks } from "../../src/db/schema/index.js";
import { createLeaseStore, type LeaseStore } from "../../src/leases/store.js";
import { createTaskStore, type NewTask, type TaskStore } from "../../src/tasks/store.js";
import { within } from "../support/bounded.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { describeEachEngine } from "../support/engines.js";
import { endBackoff, expireLease, insertWorker, newTask } from "../support/fixtures.js";
import { uniqueWorkload } from "../support/harness.js";

const workerA = "a0000000-0000-4000-8000-00000000000a";
const workerB = "b0000000-0000-4000-8000-00000000000b";

const worker = (id: string, capabilities: string[], labels: Record<string, string> = {}) => ({
  id,
  capabilities,
  labels,
});

/** The lease of `row` as its holder names it, with the token it was given. */
const leaseOf = (
  row: { id: string; attempt: number; leaseToken: string | null },
  workerId = workerA,
) => ({
  taskId: row.id,
  workerId,
  attempt: row.attempt,
  token: row.leaseToken ?? "",
});

describeEachEngine("lease rules", (db) => {
  let taskStore: TaskStore;
  let leases: LeaseStore;
  beforeAll(async () => {
    taskStore = createTaskStore(db().db);
    leases = createLeaseStore(db().db);
    await insertWorker(db().db, workerA);
    await insertWorker(db().db, workerB);
  });

  async function claimOne(workload: string, workerId = workerA) {
    const [row] = await leases.claim(worker(workerId, [workload]), 1);
    if (!row) throw new Error("nothing claimed");
    return row;
  }

  async function taskCount(): Promise<number> {
    const [row] = await db().db.select({ n: count() }).from(tasks);
    return row?.n ?? 0;
  }

  describe("an expired lease is reclaimed only by a worker that could claim the task", () => {
    const cases: [string, (workload: string) => ReturnType<typeof worker>][] = [
      ["lacks its workload", () => worker(workerB, ["other", "gpu"], { region: "eu" })],
      ["lacks a required capability", (w) => worker(workerB, [w], { region: "eu" })],
      ["has another affinity label", (w) => worker(workerB, [w, "gpu"], { region: "us" })],
      ["has no affinity label", (w) => worker(workerB, [w, "gpu"])],
    ];
    it.each(cases)("is not handed to a worker that %s", async (_, unfit) => {
      const workload = uniqueWorkload();
      await taskStore.create([
        newTask({ workload, requiredCapabilities: ["gpu"], affinity: { region: "eu" } }),
      ]);
      const fit = worker(workerA, [workload, "gpu"], { region: "eu", zone: "b" });
      const [first] = await leases.claim(fit, 1);
      if (!first) throw new Error("nothing claimed");
      await expireLease(db().db, first.id);
      expect(await leases.claim(unfit(workload), 5)).toEqual([]);
      const [again] = await leases.claim(fit, 5);
      expect(again).toMatchObject({ id: first.id, attempt: 2, leaseWorkerId: workerA });
    });

    it("gives each claim of a batch its own answer when the database refuses one of them", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload }), newTask({ workload })]);
      // The first call runs alone; the two made while it is in flight go
      // together in the next statement, where the second's capability (a lone
      // surrogate, which jsonb cannot hold) makes the database refuse it all.
      const first = leases.claimCounted(worker(workerA, ["nothing-to-claim"]), 1);
      const good = leases.claimCounted(worker(workerB, [workload]), 1);
      const bad = leases.claimCounted(worker(workerA, ["\ud800"]), 1);
      expect((await first).rows).toEqual([]);
      const claimed = await good;
      expect(claimed.rows).toHaveLength(1);
      expect(claimed.rows[0]?.leaseWorkerId).toBe(workerB);
      expect(claimed.slots).toBeDefined();
      await expect(bad).rejects.toThrow();
    });

    it("is not handed out once the task's deadline has passed; the sweeper fails it", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, deadline: new Date(Date.now() + 3_600_000) })]);
      const first = await claimOne(workload);
      await db()
        .db.update(tasks)
        .set({ deadline: sql`now() - interval '1 second'` })
        .where(eq(tasks.id, first.id));
      await expireLease(db().db, first.id);
      expect(await leases.claim(worker(workerB, [workload]), 5)).toEqual([]);
      await leases.expireLeases(1000);
      await leases.failPastDeadline(1000);
      expect(await taskStore.get(first.id)).toMatchObject({
        state: "FAILED",
        errorCode: "DEADLINE_EXCEEDED",
      });
    });

    it("is not handed out when the task has no attempts left; the sweeper fails it (LEASE_EXPIRED)", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, maxAttempts: 1 })]);
      const first = await claimOne(workload);
      await expireLease(db().db, first.id);
      expect(await leases.claim(worker(workerB, [workload]), 5)).toEqual([]);
      await leases.expireLeases(1000);
      expect(await taskStore.get(first.id)).toMatchObject({
        state: "FAILED",
        attempt: 1,
        errorCode: "LEASE_EXPIRED",
      });
    });
  });

  it("gives a worker at max_concurrency 1 one task when its own lease expired and a new task waits", async () => {
    const workload = uniqueWorkload();
    const single = "e2000000-0000-4000-8000-0000000000e2";
    await insertWorker(db().db, single, false, 1);
    await taskStore.create([newTask({ workload, name: "A" })]);
    const [a] = await leases.claim(worker(single, [workload]), 5);
    if (!a) throw new Error("nothing claimed");
    await expireLease(db().db, a.id);
    await taskStore.create([newTask({ workload, name: "B" })]);
    const claimed = await leases.claim(worker(single, [workload]), 5);
    expect(claimed).toHaveLength(1);
    expect(claimed[0]).toMatchObject({ name: "A", attempt: 2 }); // the older task first
    expect(await leases.claim(worker(single, [workload]), 5)).toEqual([]);
  });

  describe("idempotency keys", () => {
    const input: ArtifactRefJson = {
      artifactId: "11111111-1111-4111-8111-111111111111",
      uri: "http://127.0.0.1:8080/artifacts/11111111-1111-4111-8111-111111111111/download",
      sha256: "a".repeat(64),
      sizeBytes: 3,
      contentType: "text/csv",
    };
    const base = (key: string) => newTask({ idempotencyKey: key, input });
    const b = base("").backoff;
    const changed: [string, Partial<NewTask>][] = [
      ["name", { name: "other" }],
      ["workload", { workload: "other-workload" }],
      ["requiredCapabilities", { requiredCapabilities: ["gpu"] }],
      ["affinity", { affinity: { region: "eu" } }],
      ["priority", { priority: 1 }],
      ["deadline", { deadline: new Date(Date.now() + 3_600_000) }],
      ["parameters", { parameters: { n: 2 } }],
      ["steps", { steps: 5 }],
      ["maxAttempts", { maxAttempts: 4 }],
      ["leaseSeconds", { leaseSeconds: 61 }],
      ["backoff.initialMs", { backoff: { ...b, initialMs: b.initialMs + 1 } }],
      ["backoff.maxMs", { backoff: { ...b, maxMs: b.maxMs + 1 } }],
      ["backoff.multiplier", { backoff: { ...b, multiplier: b.multiplier + 1 } }],
      ["input (none)", { input: null }],
      ["input (other bytes)", { input: { ...input, sha256: "b".repeat(64) } }],
      ["input (other size)", { input: { ...input, sizeBytes: 4 } }],
    ];
    it.each(changed)(
      "refuses the same key with another %s (already_exists) and creates nothing",
      async (_, change) => {
        const key = randomUUID();
        const [original] = await taskStore.create([base(key)]);
        const before = await taskCount();
        await expect(taskStore.create([{ ...base(key), ...change }])).rejects.toMatchObject({
          kind: "already_exists",
          reason: "IDEMPOTENCY_KEY_REUSED",
          details: { taskId: original?.id },
        });
        expect(await taskCount()).toBe(before);
        expect(await taskStore.get(original?.id ?? "")).toEqual(original);
      },
    );

    const sameBytes = randomUUID();
    const same: [string, Partial<NewTask>][] = [
      ["the same request", {}],
      ["another correlation id", { correlationId: "another-trace" }],
      ["parameter keys in another order", { parameters: { z: 1, a: { y: 2, b: 3 } } }],
      [
        "another input artifact of the same bytes",
        { input: { ...input, artifactId: sameBytes, uri: "http://elsewhere/x" } },
      ],
    ];
    // A create locks the inputs it names, which must exist (tasks/store.ts).
    beforeAll(async () => {
      await db()
        .db.insert(artifacts)
        .values(
          [input.artifactId, sameBytes].map((id) => ({
            id,
            filename: "input",
            kind: "INPUT" as const,
            sha256: input.sha256,
            sizeBytes: input.sizeBytes,
          })),
        );
    });
    it.each(same)("returns the existing task for the same key with %s", async (_, change) => {
      const key = randomUUID();
      const first = { ...base(key), parameters: { a: { b: 3, y: 2 }, z: 1 } };
      const [original] = await taskStore.create([first]);
      const before = await taskCount();
      const [again] = await taskStore.create([{ ...first, ...change }]);
      expect(again?.id).toBe(original?.id);
      expect(await taskCount()).toBe(before);
    });
  });

  it("waits initial × multiplier^(failures − 1), capped at max, before each retry", async () => {
    const workload = uniqueWorkload();
    await taskStore.create([
      newTask({
        workload,
        maxAttempts: 10,
        backoff: { initialMs: 1000, maxMs: 5000, multiplier: 3 },
      }),
    ]);
    const waits: number[] = [];
    for (let attempt = 1; attempt <= 4; attempt++) {
      const row = await claimOne(workload);
      expect(row.attempt).toBe(attempt);
      const failed = await leases.fail(leaseOf(row), "E", "again", true);
      expect(failed.state).toBe("PENDING");
      // Both set by now() in one statement: the database clock, no sleeping.
      waits.push((failed.notBefore?.getTime() ?? 0) - failed.updatedAt.getTime());
      await endBackoff(db().db, row.id);
    }
    expect(waits).toEqual([1000, 3000, 5000, 5000].map((ms) => expect.closeTo(ms, -1)));
  });

  describe("StreamLeases renewals (renewMany)", () => {
    it("refuses a renewal with another token (TOKEN_MISMATCH) and leaves the expiry as it was", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, leaseSeconds: 30 })]);
      const row = await claimOne(workload);
      const [wrong] = await leases.renewMany(workerA, [
        { taskId: row.id, attempt: 1, token: "f".repeat(64) },
      ]);
      expect(wrong).toMatchObject({ error: { kind: "aborted", reason: "TOKEN_MISMATCH" } });
      expect((await taskStore.get(row.id)).leaseExpiresAt).toEqual(row.leaseExpiresAt);
      const [right] = await leases.renewMany(workerA, [
        { taskId: row.id, attempt: 1, token: row.leaseToken ?? "" },
      ]);
      expect(right && "ok" in right).toBe(true);
    });

    it("refuses to renew a lease that ran out (LEASE_EXPIRED) and does not revive it", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const row = await claimOne(workload);
      await expireLease(db().db, row.id);
      const expired = (await taskStore.get(row.id)).leaseExpiresAt;
      const [renewal] = await leases.renewMany(workerA, [
        { taskId: row.id, attempt: 1, token: row.leaseToken ?? "" },
      ]);
      expect(renewal).toMatchObject({ error: { kind: "aborted", reason: "LEASE_EXPIRED" } });
      expect((await taskStore.get(row.id)).leaseExpiresAt).toEqual(expired);
      expect(await claimOne(workload, workerB)).toMatchObject({ id: row.id, attempt: 2 });
    });
  });

  describe("releases", () => {
    it("use up no attempts: released twice under max_attempts 2, the task still runs, fails, retries and succeeds", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, maxAttempts: 2 })]);
      for (let attempt = 1; attempt <= 2; attempt++) {
        const row = await claimOne(workload);
        expect(row.attempt).toBe(attempt);
        await leases.release(leaseOf(row), "");
      }
      const third = await claimOne(workload);
      expect(third.attempt).toBe(3);
      const failed = await leases.fail(leaseOf(third), "E", "first failure", true);
      expect(failed.state).toBe("PENDING");
      await endBackoff(db().db, third.id);
      const fourth = await claimOne(workload);
      expect(fourth.attempt).toBe(4);
      const [done] = await leases.complete([
        { ...leaseOf(fourth), result: null, summary: "ok", metrics: {} },
      ]);
      expect(done && "ok" in done && done.ok.state).toBe("SUCCEEDED");
    });

    it("leave a retryable failure after a release PENDING while attempts remain", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, maxAttempts: 2 })]);
      const first = await claimOne(workload);
      await leases.release(leaseOf(first), "");
      const second = await claimOne(workload);
      const failed = await leases.fail(leaseOf(second), "E", "m", true);
      expect(failed).toMatchObject({ state: "PENDING", attempt: 2, errorCode: "E" });
      expect(failed.notBefore).toBeInstanceOf(Date);
      expect(failed.finishedAt).toBeNull();
    });
  });
});

// retriesDue looks at every task, so it gets databases of its own.
describeEachEngine("retry wake-up check", (db) => {
  it("says a retry is due just after its not_before passes, not before, and not long after", async () => {
    const taskStore = createTaskStore(db().db);
    const leases = createLeaseStore(db().db);
    await insertWorker(db().db, workerA);
    const workload = uniqueWorkload();
    await taskStore.create([
      newTask({ workload, backoff: { initialMs: 60_000, maxMs: 60_000, multiplier: 2 } }),
    ]);
    expect(await leases.retriesDue(2000)).toBe(false); // PENDING, never failed
    const [row] = await leases.claim(worker(workerA, [workload]), 1);
    if (!row) throw new Error("nothing claimed");
    await leases.fail(leaseOf(row), "E", "m", true);
    expect(await leases.retriesDue(2000)).toBe(false); // backing off for a minute
    await endBackoff(db().db, row.id);
    expect(await leases.retriesDue(2000)).toBe(true);
    await db()
      .db.update(tasks)
      .set({ notBefore: sql`now() - interval '1 hour'` })
      .where(eq(tasks.id, row.id));
    expect(await leases.retriesDue(2000)).toBe(false); // due long ago: its wake-up is past
  });
});

// SKIP LOCKED only means something beside another connection: PGlite is one
// connection and serialises every transaction.
describe.skipIf(!onPostgres)("claims beside another transaction's row lock on PostgreSQL", () => {
  let tdb: TestDatabase;
  beforeAll(async () => {
    tdb = await createTestDatabase();
    await insertWorker(tdb.database.db, workerA);
  });
  afterAll(() => tdb.drop());

  it("skips the best task while another transaction holds it and hands out the next one at once", async () => {
    const taskStore = createTaskStore(tdb.database.db);
    const leases = createLeaseStore(tdb.database.db);
    const workload = uniqueWorkload();
    const [best] = await taskStore.create([newTask({ workload, name: "best", priority: 9 })]);
    await taskStore.create([newTask({ workload, name: "next", priority: 1 })]);
    const other = connectPostgres(tdb.url ?? "", { max: 1, onnotice: () => {} });
    const locker = await other.reserve();
    try {
      await locker`begin`;
      await locker`select id from tasks where id = ${best?.id ?? ""} for update`;
      const claimed = await within(5000, leases.claim(worker(workerA, [workload]), 1));
      expect(claimed === "timed out" ? claimed : claimed.map((r) => r.name)).toEqual(["next"]);
    } finally {
      await locker`rollback`;
      locker.release();
      await other.end();
    }
    expect((await leases.claim(worker(workerA, [workload]), 1)).map((r) => r.name)).toEqual([
      "best",
    ]);
  });

  it("skips an expired-lease task another transaction holds, and hands out the next one at once", async () => {
    const taskStore = createTaskStore(tdb.database.db);
    const leases = createLeaseStore(tdb.database.db);
    const workload = uniqueWorkload();
    await taskStore.create([newTask({ workload, name: "expired", priority: 9 })]);
    const [held] = await leases.claim(worker(workerA, [workload]), 1);
    await expireLease(tdb.database.db, held?.id ?? "");
    await taskStore.create([newTask({ workload, name: "next", priority: 1 })]);
    const other = connectPostgres(tdb.url ?? "", { max: 1, onnotice: () => {} });
    const locker = await other.reserve();
    try {
      await locker`begin`;
      await locker`select id from tasks where id = ${held?.id ?? ""} for update`;
      const claimed = await within(5000, leases.claim(worker(workerA, [workload]), 1));
      expect(claimed === "timed out" ? claimed : claimed.map((r) => r.name)).toEqual(["next"]);
    } finally {
      await locker`rollback`;
      locker.release();
      await other.end();
    }
  });
});
