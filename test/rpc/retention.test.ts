import { Code, ConnectError } from "@connectrpc/connect";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

// Retention as the app wires it (--retention): tasks made and cancelled
// through the RPCs, their finish moved into the past with SQL.
describe("retention through the app", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await createHarness({ retentionMs: 7 * 86_400_000 });
  });
  afterAll(() => h?.close());

  async function cancelled(input: string): Promise<{ taskId: string; sha256: string }> {
    const { task } = await h.tasks.createTask({
      workload: uniqueWorkload(),
      input: { case: "inputData", value: Buffer.from(input) },
    });
    const taskId = task?.taskId ?? "";
    await h.tasks.cancelTask({ taskId });
    return { taskId, sha256: task?.input?.sha256 ?? "" };
  }

  it("deletes a task finished before the retention, its input and bytes; GetTask is then not_found", async () => {
    const old = await cancelled("old input");
    const recent = await cancelled("input of an old and a recent task");
    const oldSharing = await cancelled("input of an old and a recent task");
    await h.app.database.db.execute(
      sql`update tasks set finished_at = now() - interval '8 days'
          where id in (${old.taskId}::uuid, ${oldSharing.taskId}::uuid)`,
    );
    expect(await h.app.retention.runOnce()).toMatchObject({ ran: true, tasks: 2, blobs: 1 });

    for (const gone of [old, oldSharing]) {
      const error = await h.tasks.getTask({ taskId: gone.taskId }).catch((e: unknown) => e);
      expect(ConnectError.from(error).code).toBe(Code.NotFound);
    }
    expect(await h.app.blobs.has(old.sha256)).toBe(false);
    const { task } = await h.tasks.getTask({ taskId: recent.taskId });
    expect(task?.input?.sha256).toBe(recent.sha256);
    expect(await h.app.blobs.has(recent.sha256)).toBe(true);
  });

  it("keeps a finished dependency while a task that depends on it waits, then deletes it", async () => {
    const workload = uniqueWorkload();
    const { tasks } = await h.tasks.createTasks({
      tasks: [
        { workload, ref: "a" },
        { workload, ref: "d", dependsOn: ["ref:a"], dependencyPolicy: 2 },
      ],
    });
    const [a, d] = tasks.map((t) => t.taskId);
    await h.tasks.cancelTask({ taskId: a ?? "" });
    // d (ALL_DONE) is claimable now; a finished 8 days ago.
    await h.app.database.db.execute(
      sql`update tasks set finished_at = now() - interval '8 days' where id = ${a}::uuid`,
    );
    await h.app.retention.runOnce();
    expect((await h.tasks.getTask({ taskId: a ?? "" })).task?.taskId).toBe(a);
    await h.tasks.cancelTask({ taskId: d ?? "" });
    await h.app.retention.runOnce();
    const error = await h.tasks.getTask({ taskId: a ?? "" }).catch((e: unknown) => e);
    expect(ConnectError.from(error).code).toBe(Code.NotFound);
  });
});
