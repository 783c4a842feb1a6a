import { eq, sql } from "drizzle-orm";
import { beforeAll, expect, it } from "vitest";
import { type TaskRow, tasks } from "../../src/db/schema/index.js";
import { rowsOf } from "../../src/db/values.js";
import { createLeaseStore, type LeaseStore } from "../../src/leases/store.js";
import { createTaskStore } from "../../src/tasks/store.js";
import { describeEachEngine } from "../support/engines.js";
import { insertWorker, newTask } from "../support/fixtures.js";
import { uniqueWorkload } from "../support/harness.js";

// One live-lease rule (src/leases/sql/live-lease.sql): the claim, the lease
// check, the slot count and the sweeper's expiry must agree on a lease whose
// expiry has just passed, by the database clock.
describeEachEngine("the live-lease rule", (db) => {
  let leases: LeaseStore;
  const holder = "c0000000-0000-4000-8000-00000000000c";
  const other = "d0000000-0000-4000-8000-00000000000d";
  beforeAll(async () => {
    leases = createLeaseStore(db().db);
    await insertWorker(db().db, holder, false, 1);
    await insertWorker(db().db, other, false, 1);
  });

  const ref = (row: Pick<TaskRow, "id" | "attempt" | "leaseToken">) => ({
    taskId: row.id,
    workerId: holder,
    attempt: row.attempt,
    token: row.leaseToken ?? "",
  });

  it("a lease whose expiry has just passed is expired for every one of them", async () => {
    const workload = uniqueWorkload();
    await createTaskStore(db().db).create([newTask({ workload })]);
    const [row] = await leases.claim({ id: holder, capabilities: [workload], labels: {} }, 1);
    if (!row) throw new Error("nothing claimed");
    expect((await leases.slots({ id: holder, capabilities: [], labels: {} })).free).toBe(0);

    // In one transaction now() does not move. expires_at keeps milliseconds:
    // now() cut to its millisecond is at most now(), the boundary itself at best.
    await db()
      .db.transaction(async (tx) => {
        await tx
          .update(tasks)
          .set({ leaseExpiresAt: sql`date_trunc('milliseconds', now())` })
          .where(eq(tasks.id, row.id));
        const [judged] = await rowsOf<{ live: unknown; expired: unknown; verdict: string | null }>(
          tx,
          sql`select meshwork_lease_live(t)::text as live, meshwork_lease_expired(t)::text as expired,
            meshwork_lease_verdict(t, ${row.attempt}, ${holder}::uuid, ${row.leaseToken}) as verdict
            from tasks t where t.id = ${row.id}`,
        );
        expect(judged).toEqual({ live: "false", expired: "true", verdict: "LEASE_EXPIRED" });
        const txLeases = createLeaseStore(tx);
        expect((await txLeases.slots({ id: holder, capabilities: [], labels: {} })).free).toBe(1);
        await expect(txLeases.renew(ref(row), undefined, undefined)).rejects.toMatchObject({
          reason: "LEASE_EXPIRED",
          message: `the lease on attempt 1 of task ${row.id} expired`,
        });
        expect(await txLeases.expireLeases(1000)).toEqual([{ id: row.id, state: "PENDING" }]);
        throw new Rollback();
      })
      .catch((error: unknown) => {
        if (!(error instanceof Rollback)) throw error;
      });

    // Rolled back: still leased, and its expiry has passed.
    await db()
      .db.update(tasks)
      .set({ leaseExpiresAt: sql`date_trunc('milliseconds', now())` })
      .where(eq(tasks.id, row.id));
    await expect(leases.renew(ref(row), undefined, undefined)).rejects.toMatchObject({
      reason: "LEASE_EXPIRED",
    });
    expect((await leases.slots({ id: holder, capabilities: [], labels: {} })).free).toBe(1);
    const [taken] = await leases.claim({ id: other, capabilities: [workload], labels: {} }, 1);
    expect(taken).toMatchObject({
      id: row.id,
      attempt: 2,
      leaseWorkerId: other,
      errorCode: "LEASE_EXPIRED",
      errorMessage: "the lease on attempt 1 expired",
    });
  });
});

class Rollback extends Error {}
