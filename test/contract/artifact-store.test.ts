import { randomUUID } from "node:crypto";
import { beforeAll, expect, it } from "vitest";
import {
  type ArtifactStore,
  createArtifactStore,
  type NewArtifact,
} from "../../src/artifacts/store.js";
import type { LeaseRef } from "../../src/core/lease-ref.js";
import { decodeCursor } from "../../src/core/paging.js";
import { createLeaseStore, type LeaseStore } from "../../src/leases/store.js";
import { createTaskStore, type TaskStore } from "../../src/tasks/store.js";
import { describeEachEngine } from "../support/engines.js";
import { expireLease, insertWorker, newTask } from "../support/fixtures.js";
import { uniqueWorkload } from "../support/harness.js";

describeEachEngine("artifact store", (db) => {
  let artifacts: ArtifactStore;
  let tasks: TaskStore;
  let leases: LeaseStore;
  const workerId = "a0000000-0000-4000-8000-00000000000a";

  beforeAll(async () => {
    artifacts = createArtifactStore(db().db);
    tasks = createTaskStore(db().db);
    leases = createLeaseStore(db().db);
    await insertWorker(db().db, workerId);
  });

  /** A task claimed by the worker, and the lease a worker would name. */
  async function leased(): Promise<LeaseRef> {
    const workload = uniqueWorkload();
    await tasks.create([newTask({ workload })]);
    const [row] = await leases.claim({ id: workerId, capabilities: [workload], labels: {} }, 1);
    if (!row) throw new Error("nothing claimed");
    return { taskId: row.id, workerId, attempt: row.attempt, token: row.leaseToken ?? "" };
  }

  function output(lease: LeaseRef | null, filename = "out.bin"): NewArtifact {
    return {
      taskId: lease?.taskId ?? null,
      attempt: lease?.attempt ?? 0,
      workerId: lease?.workerId ?? null,
      filename,
      contentType: "application/octet-stream",
      kind: lease ? "OUTPUT" : "INPUT",
      sha256: "a".repeat(64),
      sizeBytes: 3,
    };
  }

  it("stores a task artifact under a live lease and reads it back", async () => {
    const lease = await leased();
    await artifacts.checkLease(lease);
    const row = await artifacts.insert(output(lease), lease);
    expect(row).toMatchObject({ taskId: lease.taskId, attempt: 1, kind: "OUTPUT", sizeBytes: 3 });
    expect(await artifacts.get(row.id)).toEqual(row);
  });

  it("stores an INPUT artifact without a task and without a lease check", async () => {
    const row = await artifacts.insert(output(null, "input"), null);
    expect(row).toMatchObject({ taskId: null, kind: "INPUT" });
  });

  it("refuses a stale attempt, a foreign worker, a wrong token and an expired lease, keeping no row", async () => {
    const lease = await leased();
    const reason = (l: LeaseRef) =>
      artifacts.insert(output(l), l).then(
        () => "stored",
        (e: { reason: string }) => e.reason,
      );
    expect(await reason({ ...lease, attempt: 2 })).toBe("STALE_ATTEMPT");
    expect(await reason({ ...lease, workerId: randomUUID() })).toBe("FOREIGN_WORKER");
    expect(await reason({ ...lease, token: "f".repeat(64) })).toBe("TOKEN_MISMATCH");
    await expect(artifacts.checkLease({ ...lease, token: "f".repeat(64) })).rejects.toMatchObject({
      reason: "TOKEN_MISMATCH",
    });
    await expireLease(db().db, lease.taskId);
    expect(await reason(lease)).toBe("LEASE_EXPIRED");
    await expect(artifacts.checkLease(lease)).rejects.toMatchObject({ reason: "LEASE_EXPIRED" });
    expect((await artifacts.list(lease.taskId, 10, undefined)).rows).toEqual([]);
  });

  it("answers not_found for an unknown artifact and for a lease on an unknown task", async () => {
    await expect(artifacts.get(randomUUID())).rejects.toMatchObject({ kind: "not_found" });
    const lease = { taskId: randomUUID(), workerId, attempt: 1, token: "" };
    await expect(artifacts.checkLease(lease)).rejects.toMatchObject({ kind: "not_found" });
  });

  it("completes only with an artifact of the same task and attempt and its sha256 (ARTIFACT_MISMATCH)", async () => {
    const lease = await leased();
    const other = await leased();
    const mine = await artifacts.insert(output(lease), lease);
    const theirs = await artifacts.insert(output(other), other);
    const ref = (a: typeof mine, sha256 = a.sha256) => ({
      artifactId: a.id,
      uri: `http://127.0.0.1:8080/artifacts/${a.id}/download`,
      sha256,
      sizeBytes: a.sizeBytes,
      contentType: a.contentType,
    });
    const complete = (result: ReturnType<typeof ref>) =>
      leases.complete([{ ...lease, result, summary: "", metrics: {} }]);
    for (const result of [ref(theirs), ref(mine, "b".repeat(64))]) {
      const [refused] = await complete(result);
      expect(refused).toMatchObject({ error: { kind: "aborted", reason: "ARTIFACT_MISMATCH" } });
    }
    const [done] = await complete(ref(mine));
    expect(done && "ok" in done && done.ok).toMatchObject({
      state: "SUCCEEDED",
      result: { artifactId: mine.id, sha256: mine.sha256 },
    });
  });

  it("lists a task's artifacts oldest first, page by page, and only that task's", async () => {
    const lease = await leased();
    const other = await leased();
    const names = ["a", "b", "c", "d", "e"];
    for (const name of names) await artifacts.insert(output(lease, name), lease);
    await artifacts.insert(output(other, "other"), other);
    const seen: { filename: string; key: string }[] = [];
    let token = "";
    for (let page = 0; page < 5; page++) {
      const { rows, next } = await artifacts.list(lease.taskId, 2, decodeCursor(token));
      expect(rows.length).toBeLessThanOrEqual(2);
      seen.push(
        ...rows.map((r) => ({ filename: r.filename, key: `${r.createdAt.toISOString()} ${r.id}` })),
      );
      if (next === "") break;
      token = next;
    }
    // Every artifact once, in (created_at, id) order.
    expect(seen.map((s) => s.filename).sort()).toEqual(names);
    const keys = seen.map((s) => s.key);
    expect(keys).toEqual([...keys].sort());
  });
});
