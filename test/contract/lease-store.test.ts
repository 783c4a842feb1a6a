import { createHash } from "node:crypto";
import { eq, sql } from "drizzle-orm";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { tasks } from "../../src/db/schema/index.js";
import { rowsOf } from "../../src/db/values.js";
import { readyHintMaxMs } from "../../src/leases/claim.js";
import {
  type Completion,
  completionHash,
  createLeaseStore,
  type ExpirySweep,
  type LeaseStore,
} from "../../src/leases/store.js";
import { createTaskStore, type NewTask, type TaskStore } from "../../src/tasks/store.js";
import { describeEachEngine } from "../support/engines.js";
import { endBackoff, expireLease, insertWorker, newTask } from "../support/fixtures.js";
import { uniqueWorkload } from "../support/harness.js";
import { connectionReset, failStatement } from "../support/statement-faults.js";

describeEachEngine("lease store", (db) => {
  /** The database of the engine being run (set before the first test). */
  const tdb = {
    get database() {
      return db();
    },
  };
  let taskStore: TaskStore;
  let leases: LeaseStore;
  const workerA = "a0000000-0000-4000-8000-00000000000a";
  const workerB = "b0000000-0000-4000-8000-00000000000b";

  beforeAll(async () => {
    taskStore = createTaskStore(tdb.database.db);
    leases = createLeaseStore(tdb.database.db);
    await insertWorker(tdb.database.db, workerA);
    await insertWorker(tdb.database.db, workerB);
  });

  const worker = (id: string, capabilities: string[], labels: Record<string, string> = {}) => ({
    id,
    capabilities,
    labels,
  });

  async function claimOne(workload: string, workerId = workerA) {
    const [row] = await leases.claim(worker(workerId, [workload]), 1);
    if (!row) throw new Error("nothing claimed");
    return row;
  }

  function completion(
    row: { id: string; attempt: number },
    workerId = workerA,
    summary = "done",
  ): Completion {
    return {
      taskId: row.id,
      workerId,
      attempt: row.attempt,
      token: "",
      result: null,
      summary,
      metrics: { rows: 3 },
    };
  }

  describe("the lease a token names (the director's REST contract)", () => {
    it("gives the holder and attempt for the task's token, nothing for another, not_found for no task", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const row = await claimOne(workload);
      const token = row.leaseToken ?? "";
      expect(await leases.leaseByToken(row.id, token)).toEqual({
        workerId: workerA,
        attempt: row.attempt,
      });
      // Another token: the last digit changed (to one it is not).
      const other = `${token.slice(0, -1)}${token.endsWith("0") ? "1" : "0"}`;
      expect(await leases.leaseByToken(row.id, other)).toBeNull();
      // A token PostgreSQL cannot hold as text names no lease: refused as
      // any other wrong token, not an internal error.
      expect(await leases.leaseByToken(row.id, `${token}\u0000`)).toBeNull();
      await expect(
        leases.leaseByToken("c0000000-0000-4000-8000-00000000000c", `x\u0000`),
      ).rejects.toMatchObject({ kind: "not_found" });
    });
  });

  describe("claims", () => {
    it("leases a task with attempt 1, a 256-bit token and an expiry lease_seconds ahead", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, leaseSeconds: 30 })]);
      const row = await claimOne(workload);
      expect(row).toMatchObject({ state: "RUNNING", attempt: 1, leaseWorkerId: workerA });
      expect(row.leaseToken).toMatch(/^[0-9a-f]{64}$/);
      const ttl = (row.leaseExpiresAt?.getTime() ?? 0) - (row.updatedAt.getTime() ?? 0);
      expect(ttl).toBeGreaterThanOrEqual(29_000);
      expect(ttl).toBeLessThanOrEqual(31_000);
      expect(await leases.claim(worker(workerB, [workload]), 1)).toEqual([]);
    });

    it("orders by priority, then earliest deadline, then age, and honours max_tasks", async () => {
      const workload = uniqueWorkload();
      const soon = new Date(Date.now() + 60_000);
      const later = new Date(Date.now() + 120_000);
      await taskStore.create([newTask({ workload, name: "old-low" })]);
      await taskStore.create([
        newTask({ workload, name: "late-deadline", priority: 5, deadline: later }),
      ]);
      await taskStore.create([newTask({ workload, name: "no-deadline", priority: 5 })]);
      await taskStore.create([
        newTask({ workload, name: "soon-deadline", priority: 5, deadline: soon }),
      ]);
      await taskStore.create([newTask({ workload, name: "high", priority: 9 })]);
      const first = await leases.claim(worker(workerA, [workload]), 3);
      expect(first.map((r) => r.name)).toEqual(["high", "soon-deadline", "late-deadline"]);
      const rest = await leases.claim(worker(workerA, [workload]), 10);
      expect(rest.map((r) => r.name)).toEqual(["no-deadline", "old-low"]);
    });

    it("matches workload, required capabilities and affinity against the worker", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([
        newTask({ workload, name: "gpu", requiredCapabilities: ["gpu"] }),
        newTask({ workload, name: "eu", affinity: { region: "eu" } }),
      ]);
      expect(await leases.claim(worker(workerA, ["other"]), 10)).toEqual([]);
      expect(await leases.claim(worker(workerA, [workload], { region: "us" }), 10)).toEqual([]);
      const gpu = await leases.claim(worker(workerA, [workload, "gpu"], { region: "us" }), 10);
      expect(gpu.map((r) => r.name)).toEqual(["gpu"]);
      const eu = await leases.claim(worker(workerB, [workload], { region: "eu", zone: "b" }), 10);
      expect(eu.map((r) => r.name)).toEqual(["eu"]);
    });

    it("reclaims an expired lease at once, under the next attempt, fencing the old holder", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const first = await claimOne(workload, workerA);
      await expireLease(tdb.database.db, first.id);
      const second = await claimOne(workload, workerB);
      expect(second).toMatchObject({ id: first.id, attempt: 2, leaseWorkerId: workerB });
      // The task says what happened to attempt 1; a first claim says nothing.
      expect(first).toMatchObject({ errorCode: "", errorMessage: "" });
      expect(second).toMatchObject({
        errorCode: "LEASE_EXPIRED",
        errorMessage: "the lease on attempt 1 expired",
      });
      const [late] = await leases.complete([completion(first, workerA)]);
      expect(late).toMatchObject({ error: { kind: "aborted", reason: "STALE_ATTEMPT" } });
      const [ok] = await leases.complete([completion(second, workerB)]);
      expect(ok && "ok" in ok && ok.ok.state).toBe("SUCCEEDED");
    });

    it("bounds what a worker holds, claimed and placed, by its max_concurrency", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload }), newTask({ workload }), newTask({ workload })]);
      const small = "e1000000-0000-4000-8000-0000000000e1";
      await insertWorker(tdb.database.db, small, false, 2);
      expect(await leases.claim(worker(small, [workload]), 5)).toHaveLength(2);
      expect(await leases.claim(worker(small, [workload]), 5)).toEqual([]);
    });

    it("frees a worker's slot as soon as its task completes, fails, is released or cancelled", async () => {
      const workload = uniqueWorkload();
      const one = "e2000000-0000-4000-8000-0000000000e2";
      await insertWorker(tdb.database.db, one, false, 1);
      await taskStore.create(
        Array.from({ length: 5 }, () => newTask({ workload, maxAttempts: 1 })),
      );
      const take = async () => {
        const [row] = await leases.claim(worker(one, [workload]), 5);
        if (!row) throw new Error("the slot was not freed");
        return { taskId: row.id, workerId: one, attempt: row.attempt, token: "" };
      };
      await leases.complete([{ ...(await take()), result: null, summary: "", metrics: {} }]);
      await leases.fail(await take(), "E", "failed", false);
      await leases.release(await take(), "");
      await taskStore.cancel((await take()).taskId, "no longer needed");
      expect(await take()).toBeDefined();
    });

    it("gives nothing to a drained or unknown worker", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const drained = "e0000000-0000-4000-8000-00000000000e";
      await insertWorker(tdb.database.db, drained, true);
      expect(await leases.claim(worker(drained, [workload]), 1)).toEqual([]);
      expect(
        await leases.claim(worker("f0000000-0000-4000-8000-00000000000f", [workload]), 1),
      ).toEqual([]);
      expect(await leases.claim(worker(workerA, [workload]), 1)).toHaveLength(1);
    });

    it("does not hand out a task before its not_before or after its deadline", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, deadline: new Date(Date.now() - 1000) })]);
      expect(await leases.claim(worker(workerA, [workload]), 5)).toEqual([]);
      expect(await leases.failPastDeadline(1000)).toHaveLength(1);

      const retried = uniqueWorkload();
      await taskStore.create([newTask({ workload: retried })]);
      const row = await claimOne(retried);
      const failed = await leases.fail(
        { taskId: row.id, workerId: workerA, attempt: 1, token: "" },
        "E",
        "m",
        true,
      );
      expect(failed.notBefore?.getTime()).toBeGreaterThan(failed.updatedAt.getTime());
      expect(await leases.claim(worker(workerB, [retried]), 5)).toEqual([]);
      await endBackoff(tdb.database.db, row.id);
      expect(await claimOne(retried, workerB)).toMatchObject({ id: row.id, attempt: 2 });
    });
  });

  describe("lease checks", () => {
    it("names each reason a lease-bound request is refused", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const row = await claimOne(workload);
      const ref = { taskId: row.id, workerId: workerA, attempt: 1, token: row.leaseToken ?? "" };
      const reason = (p: Promise<unknown>) =>
        p.then(
          () => "accepted",
          (e: { reason: string }) => e.reason,
        );
      expect(await reason(leases.renew({ ...ref, attempt: 2 }, undefined, undefined))).toBe(
        "STALE_ATTEMPT",
      );
      expect(await reason(leases.renew({ ...ref, workerId: workerB }, undefined, undefined))).toBe(
        "FOREIGN_WORKER",
      );
      expect(
        await reason(leases.renew({ ...ref, token: "f".repeat(64) }, undefined, undefined)),
      ).toBe("TOKEN_MISMATCH");
      expect(
        await reason(
          leases.renew(
            { ...ref, taskId: "00000000-0000-4000-8000-000000000000" },
            undefined,
            undefined,
          ),
        ),
      ).toBe("NOT_FOUND");
      expect(await reason(leases.renew(ref, undefined, undefined))).toBe("accepted");
      await expireLease(tdb.database.db, row.id);
      expect(await reason(leases.renew(ref, undefined, undefined))).toBe("LEASE_EXPIRED");
      expect(await reason(leases.fail(ref, "E", "m", true))).toBe("LEASE_EXPIRED");
      const [sweep] = await leases.expireLeases(1000).then((r) => r.filter((x) => x.id === row.id));
      expect(sweep?.state).toBe("PENDING");
      expect(await reason(leases.renew(ref, undefined, undefined))).toBe("LEASE_EXPIRED");
    });

    it("revokes the lease of a cancelled task", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const row = await claimOne(workload);
      await taskStore.cancel(row.id, "stop");
      const ref = { taskId: row.id, workerId: workerA, attempt: 1, token: "" };
      await expect(leases.renew(ref, undefined, undefined)).rejects.toMatchObject({
        kind: "aborted",
        reason: "TASK_CANCELED",
      });
      const [done] = await leases.complete([completion(row)]);
      expect(done).toMatchObject({ error: { reason: "TASK_CANCELED" } });
      expect((await taskStore.get(row.id)).state).toBe("CANCELED");
    });

    it("renews with extend_seconds and records progress", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, steps: 10 })]);
      const row = await claimOne(workload);
      const ref = { taskId: row.id, workerId: workerA, attempt: 1, token: row.leaseToken ?? "" };
      const renewed = await leases.renew(ref, 3600, { completedSteps: 4, message: "halfway" });
      expect((renewed.leaseExpiresAt?.getTime() ?? 0) - Date.now()).toBeGreaterThan(3_500_000);
      expect(await taskStore.get(row.id)).toMatchObject({
        progressSteps: 4,
        progressMessage: "halfway",
      });
    });

    it("renews many leases in one call, answering each in order", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload }), newTask({ workload })]);
      const [a, b] = await leases.claim(worker(workerA, [workload]), 2);
      if (!a || !b) throw new Error("claim");
      await taskStore.cancel(b.id, "x");
      const out = await leases.renewMany(workerA, [
        { taskId: a.id, attempt: 1, token: a.leaseToken ?? "" },
        { taskId: b.id, attempt: 1, token: "" },
        { taskId: a.id, attempt: 7, token: "" },
      ]);
      expect("ok" in (out[0] ?? {})).toBe(true);
      expect(out[1]).toMatchObject({ error: { reason: "TASK_CANCELED" } });
      expect(out[2]).toMatchObject({ error: { reason: "STALE_ATTEMPT" } });
      const foreign = await leases.renewMany(workerB, [{ taskId: a.id, attempt: 1, token: "" }]);
      expect(foreign[0]).toMatchObject({ error: { reason: "FOREIGN_WORKER" } });
    });

    it("reads the refused renewals again after a lost connection", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const [a] = await leases.claim(worker(workerA, [workload]), 1);
      if (!a) throw new Error("claim");
      const fault = failStatement(tdb.database.db, "meshwork_lease_judged_many", connectionReset);
      const store = createLeaseStore(tdb.database.db);
      const out = await store.renewMany(workerA, [
        { taskId: a.id, attempt: 1, token: a.leaseToken ?? "" },
        { taskId: a.id, attempt: 7, token: "" },
      ]);
      expect(fault.failed()).toBe(1);
      expect("ok" in (out[0] ?? {})).toBe(true);
      expect(out[1]).toMatchObject({ error: { reason: "STALE_ATTEMPT" } });
    });
  });

  describe("completion", () => {
    it("succeeds once, accepts an identical repeat, and refuses a different manifest", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const row = await claimOne(workload);
      const [first] = await leases.complete([completion(row)]);
      expect(first && "ok" in first && first.ok).toMatchObject({
        state: "SUCCEEDED",
        resultSummary: "done",
        metrics: { rows: 3 },
      });
      const [repeat] = await leases.complete([completion(row)]);
      expect(repeat && "ok" in repeat && repeat.ok.id).toBe(row.id);
      const [other] = await leases.complete([completion(row, workerA, "something else")]);
      expect(other).toMatchObject({
        error: { kind: "already_exists", reason: "COMPLETION_CONFLICT" },
      });
      expect((await taskStore.get(row.id)).resultSummary).toBe("done");
    });

    it("tells a completion without a manifest from one that adds only metrics or a value", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const row = await claimOne(workload);
      const bare: Completion = { ...completion(row, workerA, ""), metrics: {} };
      // As rows completed before stored it: a repeat after an upgrade still matches.
      expect(completionHash(bare)).toBe(
        createHash("sha256").update('{"metrics":{},"result":null,"summary":""}').digest("hex"),
      );
      const [first] = await leases.complete([bare]);
      expect(first && "ok" in first && first.ok.state).toBe("SUCCEEDED");
      const [repeat] = await leases.complete([{ ...bare, metrics: {} }]);
      expect(repeat && "ok" in repeat && repeat.ok.id).toBe(row.id);
      for (const other of [
        { ...bare, metrics: { rows: 0 } },
        { ...bare, value: { rows: 0 } },
      ]) {
        const [refused] = await leases.complete([other]);
        expect(refused).toMatchObject({
          error: { kind: "already_exists", reason: "COMPLETION_CONFLICT" },
        });
      }
      expect((await taskStore.get(row.id)).metrics).toEqual({});
    });

    it("stores each manifest of a batch as sent, a bare one as empty, and answers as a read gives", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload }), newTask({ workload })]);
      const [x, y] = await leases.claim(worker(workerA, [workload]), 2);
      if (!x || !y) throw new Error("claim");
      const bare: Completion = { ...completion(x, workerA, ""), metrics: {} };
      const full: Completion = {
        ...completion(y, workerA, "12 rows"),
        metrics: { rows: 12, seconds: 0.5 },
        value: { best: "CHEMBL939", scores: [0.9, 0.1] },
      };
      const out = await leases.complete([bare, full]);
      const stored = await Promise.all([x, y].map((r) => taskStore.get(r.id)));
      expect(stored.map((r) => [r.resultSummary, r.metrics, r.resultValue, r.result])).toEqual([
        ["", {}, null, null],
        ["12 rows", { rows: 12, seconds: 0.5 }, { best: "CHEMBL939", scores: [0.9, 0.1] }, null],
      ]);
      expect(out.map((o) => ("ok" in o ? o.ok : o.error))).toEqual(stored);
    });

    it("judges each completion of a batch on its own", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload }), newTask({ workload }), newTask({ workload })]);
      const rows = await leases.claim(worker(workerA, [workload]), 3);
      const [a, b, c] = rows;
      if (!a || !b || !c) throw new Error("claim");
      const out = await leases.complete([
        completion(a),
        { ...completion(b), attempt: 5 },
        completion(c, workerB),
        completion(a),
      ]);
      expect(out.map((o) => ("ok" in o ? o.ok.state : o.error.reason))).toEqual([
        "SUCCEEDED",
        "STALE_ATTEMPT",
        "FOREIGN_WORKER",
        "SUCCEEDED",
      ]);
      expect((await taskStore.get(b.id)).state).toBe("RUNNING");
    });

    it("reads the refused items again after a lost connection, and answers its own completions as done here", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload }), newTask({ workload })]);
      const [a, b] = await leases.claim(worker(workerA, [workload]), 2);
      if (!a || !b) throw new Error("claim");
      // The read that names the refusals, after the completion statement committed.
      const fault = failStatement(tdb.database.db, "meshwork_lease_judged_many", connectionReset);
      const store = createLeaseStore(tdb.database.db);
      const out = await store.complete([completion(a), { ...completion(b), attempt: 5 }]);
      expect(fault.failed()).toBe(1);
      expect(out).toMatchObject([
        { ok: { id: a.id, state: "SUCCEEDED" }, repeat: false },
        { error: { reason: "STALE_ATTEMPT" } },
      ]);
      expect((await taskStore.get(b.id)).state).toBe("RUNNING");
    });
  });

  describe("failure and release", () => {
    it("retries with exponential backoff, then fails when attempts are used up", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([
        newTask({
          workload,
          maxAttempts: 2,
          backoff: { initialMs: 10_000, maxMs: 60_000, multiplier: 3 },
        }),
      ]);
      const first = await claimOne(workload);
      const ref = { taskId: first.id, workerId: workerA, attempt: 1, token: "" };
      const failed = await leases.fail(ref, "ValueError", "bad row", true);
      expect(failed).toMatchObject({
        state: "PENDING",
        errorCode: "ValueError",
        errorMessage: "bad row",
      });
      const wait = (failed.notBefore?.getTime() ?? 0) - failed.updatedAt.getTime();
      expect(wait).toBeGreaterThanOrEqual(9_900);
      expect(wait).toBeLessThanOrEqual(10_100);
      expect(await leases.claim(worker(workerA, [workload]), 1)).toEqual([]); // still backing off
      await endBackoff(tdb.database.db, first.id);
      const second = await claimOne(workload);
      expect(second.attempt).toBe(2);
      const final = await leases.fail({ ...ref, attempt: 2 }, "ValueError", "again", true);
      expect(final).toMatchObject({ state: "FAILED", attempt: 2 });
      expect(final.finishedAt).toBeInstanceOf(Date);
    });

    it("fails at once when the error is not retryable", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const row = await claimOne(workload);
      const failed = await leases.fail(
        { taskId: row.id, workerId: workerA, attempt: 1, token: "" },
        "Fatal",
        "no",
        false,
      );
      expect(failed.state).toBe("FAILED");
    });

    it("fails an expired task whose attempts are used up (LEASE_EXPIRED)", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, maxAttempts: 1 })]);
      const row = await claimOne(workload);
      await expireLease(tdb.database.db, row.id);
      await leases.expireLeases(1000);
      expect(await taskStore.get(row.id)).toMatchObject({
        state: "FAILED",
        errorCode: "LEASE_EXPIRED",
      });
    });

    it("releases with a checkpoint without counting a failure; the next claim gets the handle", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload, maxAttempts: 1 })]);
      const first = await claimOne(workload);
      const released = await leases.release(
        { taskId: first.id, workerId: workerA, attempt: 1, token: "" },
        "ckpt-42",
      );
      expect(released).toMatchObject({ state: "PENDING", checkpointHandle: "ckpt-42" });
      const second = await claimOne(workload, workerB);
      expect(second).toMatchObject({ attempt: 2, checkpointHandle: "ckpt-42" });
      // max_attempts is 1, yet a failure of this attempt still counts as its first.
      const failed = await leases.fail(
        { taskId: first.id, workerId: workerB, attempt: 2, token: "" },
        "E",
        "m",
        true,
      );
      expect(failed.state).toBe("FAILED");
    });

    it("never lets the sweeper overwrite a completion that committed first", async () => {
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload })]);
      const row = await claimOne(workload);
      await leases.complete([completion(row)]);
      await tdb.database.db
        .update(tasks)
        .set({ leaseExpiresAt: new Date(Date.now() - 60_000) })
        .where(eq(tasks.id, row.id));
      await leases.expireLeases(1000);
      expect((await taskStore.get(row.id)).state).toBe("SUCCEEDED");
    });
  });

  // A claim batch looks for the first ready task from where the last batch
  // of the same store found it, while the ready epoch has not moved
  // (sql/claim-batch.sql): whatever becomes ready ahead of it moves the
  // epoch, and is taken first.
  describe("claims from the first ready task the last batch found", () => {
    /** The clock the store reads (performance.now), `ahead` ms ahead (moved by `to`) until restored. */
    function movedClock(ahead: number) {
      const realNow = performance.now.bind(performance);
      const spy = vi.spyOn(performance, "now").mockImplementation(() => realNow() + ahead);
      return {
        to: (ms: number) => {
          ahead = ms;
        },
        mockRestore: () => spy.mockRestore(),
      };
    }

    /**
     * A PENDING task of `workload` created an hour ago, as if by a
     * transaction that began before the tasks found since were created and
     * committed after: nothing moves the ready epoch.
     */
    async function outOfSight(workload: string): Promise<{ id: string }> {
      const [row] = await rowsOf<{ id: string }>(
        tdb.database.db,
        sql`insert into tasks (id, workload, state, max_attempts, lease_seconds,
            backoff_initial_ms, backoff_max_ms, backoff_multiplier, created_at)
          values (gen_random_uuid(), ${workload}, 'PENDING', 3, 60, 1000, 300000, 2,
            now() - interval '1 hour')
          returning id`,
      );
      if (!row) throw new Error("not inserted");
      return row;
    }

    /** A store whose hints last a minute unless said, and tasks created one call each (each its own created_at). */
    function setup(hintMs = 60_000) {
      const store = createLeaseStore(tdb.database.db, undefined, undefined, hintMs);
      const workload = uniqueWorkload();
      const next = async () => (await store.claim(worker(workerA, [workload]), 1)).map((t) => t.id);
      const one = async (fields: Partial<NewTask> = {}) => {
        const [row] = await taskStore.create([newTask({ workload, ...fields })]);
        if (!row) throw new Error("not created");
        return row;
      };
      return { store, workload, next, one };
    }

    it("still take first what became ready ahead of it: a lease back to PENDING, a task fallen due, a higher priority", async () => {
      const { store, workload, next, one } = setup();
      const a = await one();
      const late = await one({ delayMs: 1000 });
      const b = await one();
      const c = await one();
      const d = await one();
      const e = await one();
      expect(await next()).toEqual([a.id]);
      expect(await next()).toEqual([b.id]);
      // a's lease ran out and the sweeper put it back: older than c.
      await expireLease(tdb.database.db, a.id);
      expect(await store.expireLeases(1000)).toContainEqual({ id: a.id, state: "PENDING" });
      expect(await next()).toEqual([a.id]);
      expect(await next()).toEqual([c.id]);
      // A task created without a priority comes after the others.
      const fresh = await one();
      // `late` falls due: older than d, it is taken first once the sweeper
      // has seen it fall due.
      await new Promise((r) => setTimeout(r, 1100));
      expect((await store.dueRetries(5000)).get(workload)).toBe(1);
      expect(await next()).toEqual([late.id]);
      expect(await next()).toEqual([d.id]);
      // Created after, with a priority.
      const high = await one({ priority: 5 });
      expect(await next()).toEqual([high.id]);
      expect(await next()).toEqual([e.id]);
      expect(await next()).toEqual([fresh.id]);
    });

    it("still reserve the worker for a large task of the same priority with a later deadline", async () => {
      const { workload, one } = setup();
      const small = "c1000000-0000-4000-8000-0000000000c1";
      await insertWorker(tdb.database.db, small, false, 2);
      const soon = new Date(Date.now() + 86_400_000);
      const first = await one({ deadline: soon });
      await one({ deadline: soon });
      const large = await one({
        deadline: new Date(soon.getTime() + 86_400_000),
        resources: { slots: 2 },
      });
      // A claim of one from the first task's key, looking for a task to
      // reserve (reserve_after_ms 0): it takes the first, and the large
      // task no longer fits what it leaves.
      const taken = await rowsOf<{ id: string }>(
        tdb.database.db,
        sql`select id from meshwork_claim(${small}::uuid, ARRAY[${workload}]::text[], '{}'::jsonb, 1, null,
          null, 0, null, 0, ${first.deadline?.toISOString()}::timestamptz,
          ${first.createdAt.toISOString()}::timestamptz)`,
      );
      expect(taken.map((r) => r.id)).toEqual([first.id]);
      const [w] = await rowsOf<{ reserved: string | null }>(
        tdb.database.db,
        sql`select reserved_task_id as reserved from workers where id = ${small}::uuid`,
      );
      expect(w?.reserved).toBe(large.id);
    });

    it("take tasks created in the same millisecond in the order of their ids, whatever the order of their rows", async () => {
      const { next, workload } = setup();
      // Both created in one millisecond (as the tasks of one CreateTasks
      // call are); the later id written first, so that the table and an
      // index that stopped at created_at would hold it first.
      const at = new Date(Date.now() - 60_000).toISOString();
      const [first, second] = [
        "01a24fe2-0000-7000-8000-000000000001",
        "01a24fe2-0000-7000-8000-000000000002",
      ];
      for (const id of [second, first]) {
        await rowsOf(
          tdb.database.db,
          sql`insert into tasks (id, workload, state, max_attempts, lease_seconds,
              backoff_initial_ms, backoff_max_ms, backoff_multiplier, created_at)
            values (${id}::uuid, ${workload}, 'PENDING', 3, 60, 1000, 300000, 2, ${at}::timestamptz)`,
        );
      }
      expect(await next()).toEqual([first]);
      expect(await next()).toEqual([second]);
    });

    it("take a task made ready out of the ready epoch's sight once the hint has lasted its time", async () => {
      const { next, one } = setup(300);
      const a = await one();
      const b = await one();
      const c = await one();
      expect(await next()).toEqual([a.id]);
      // As if created by a transaction that began before b was created and
      // committed after a claim found b: nothing moves the epoch.
      const old = await outOfSight(a.workload);
      // Past the longest a hint is kept (a minute), on the clock the store reads.
      const clock = movedClock(readyHintMaxMs + 1000);
      try {
        expect(await next()).toEqual([old.id]);
        expect(await next()).toEqual([b.id]);
        expect(await next()).toEqual([c.id]);
      } finally {
        clock.mockRestore();
      }
    });

    it("keep a hint longer when the look from the head that found it was slow", async () => {
      const { next, one } = setup(300);
      // The clock the store reads, moved by hand; and every look from the
      // head reported as taking 100 ms (as behind a transaction held open:
      // claim-batch.sql, headMs), which keeps its hint 5 s (claim.ts, hintLife).
      const clock = movedClock(0);
      const realParse = JSON.parse;
      const parse = vi.spyOn(JSON, "parse").mockImplementation((text: string) => {
        const value = realParse(text);
        if (value && typeof value === "object" && "epoch" in value && value.head)
          value.headMs = 100;
        return value;
      });
      try {
        // The first ready task must be this test's: tasks other tests left are canceled.
        await tdb.database.db.execute(
          sql`update tasks set state = 'CANCELED', finished_at = now() where state = 'PENDING'`,
        );
        const a = await one();
        const b = await one();
        expect(await next()).toEqual([a.id]);
        const old = await outOfSight(a.workload);
        // Past the 300 ms a quick look would allow, within the 5 s: the hint holds.
        clock.to(1000);
        expect(await next()).toEqual([b.id]);
        // Past the 5 s: the look from the head finds the older task.
        clock.to(6000);
        expect(await next()).toEqual([old.id]);
      } finally {
        parse.mockRestore();
        clock.mockRestore();
      }
    });
  });

  // Claims, and the sweeper's passes but one a minute, look for expired
  // leases from where the sweeper's last pass that left none behind began,
  // less a margin (leases/claim.ts, ExpirySweep): a lease expired before
  // that is the next whole pass's, never lost.
  describe("claims after a sweeper pass", () => {
    /**
     * Two leases of workerA, a pass of the sweeper's store that sets the
     * mark (`fromMark` as given: none is set yet either way), then `a`'s
     * lease moved a second into the past (after the mark) and `b`'s an
     * hour (before it).
     */
    async function leasesAroundTheMark(fromMark: boolean) {
      const sweep: ExpirySweep = { sweptTo: null };
      const store = createLeaseStore(tdb.database.db, undefined, sweep);
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload }), newTask({ workload })]);
      const [a] = await store.claim(worker(workerA, [workload]), 1);
      const [b] = await store.claim(worker(workerA, [workload]), 1);
      if (!a || !b) throw new Error("nothing claimed");
      expect(await store.expireLeases(1000, fromMark)).toEqual([]);
      expect(sweep.sweptTo).not.toBeNull();
      await expireLease(tdb.database.db, a.id);
      await tdb.database.db
        .update(tasks)
        .set({ leaseExpiresAt: sql`now() - interval '1 hour'` })
        .where(eq(tasks.id, b.id));
      return { store, workload, a, b };
    }

    it("take a lease that expired a moment ago at once, and one that expired before the pass after the next pass", async () => {
      const { store, workload, a, b } = await leasesAroundTheMark(false);
      const first = await store.claim(worker(workerB, [workload]), 2);
      expect(first.map((t) => t.id)).toContain(a.id);
      expect(first.find((t) => t.id === a.id)?.attempt).toBe(2);
      await store.expireLeases(1000);
      const second = await store.claim(worker(workerB, [workload]), 2);
      const taken = [...first, ...second].map((t) => t.id).sort();
      expect(taken).toEqual([a.id, b.id].sort());
      for (const id of [a.id, b.id]) {
        expect(await taskStore.get(id)).toMatchObject({ state: "RUNNING", leaseWorkerId: workerB });
      }
    });

    it("take every lease that expired after the mark, oldest first, behind one this worker cannot take", async () => {
      const sweep: ExpirySweep = { sweptTo: null };
      const store = createLeaseStore(tdb.database.db, undefined, sweep);
      const workload = uniqueWorkload();
      const other = uniqueWorkload();
      await taskStore.create([
        newTask({ workload }),
        newTask({ workload }),
        newTask({ workload: other }),
      ]);
      const [a, b] = await store.claim(worker(workerA, [workload]), 2);
      const [o] = await store.claim(worker(workerA, [other]), 1);
      if (!a || !b || !o) throw new Error("nothing claimed");
      expect(await store.expireLeases(1000)).toEqual([]);
      expect(sweep.sweptTo).not.toBeNull();
      // After the mark (it is 5 s before the pass), in this order: o, b, a.
      for (const [id, ago] of [
        [o.id, 3],
        [b.id, 2],
        [a.id, 1],
      ] as const) {
        await tdb.database.db
          .update(tasks)
          .set({ leaseExpiresAt: sql`now() - make_interval(secs => ${ago})` })
          .where(eq(tasks.id, id));
      }
      const taken = await store.claim(worker(workerB, [workload]), 3);
      expect(taken.map((t) => [t.id, t.attempt])).toEqual([
        [b.id, 2],
        [a.id, 2],
      ]);
      expect(await taskStore.get(o.id)).toMatchObject({ state: "RUNNING", leaseWorkerId: workerA });
      // The one no claim here could take is the sweeper's.
      expect(await store.expireLeases(1000)).toEqual([{ id: o.id, state: "PENDING" }]);
    });

    it("a pass from the mark leaves a lease that expired before it to the next whole pass", async () => {
      // The first pass from the mark, with no mark yet, looks from the first.
      const { store, a, b } = await leasesAroundTheMark(true);
      expect(await store.expireLeases(1000, true)).toEqual([{ id: a.id, state: "PENDING" }]);
      expect(await taskStore.get(b.id)).toMatchObject({ state: "RUNNING", leaseWorkerId: workerA });
      expect(await store.expireLeases(1000)).toEqual([{ id: b.id, state: "PENDING" }]);
      expect(await taskStore.get(b.id)).toMatchObject({ state: "PENDING" });
    });

    it("do not start later than a pass that stopped at its limit", async () => {
      const sweep: ExpirySweep = { sweptTo: null };
      const store = createLeaseStore(tdb.database.db, undefined, sweep);
      const workload = uniqueWorkload();
      await taskStore.create([newTask({ workload }), newTask({ workload })]);
      for (const row of await store.claim(worker(workerA, [workload]), 2)) {
        await expireLease(tdb.database.db, row.id);
      }
      expect(await store.expireLeases(1)).toHaveLength(1);
      expect(sweep.sweptTo).toBeNull();
      await store.expireLeases(1000);
      expect(sweep.sweptTo).not.toBeNull();
    });
  });
});
