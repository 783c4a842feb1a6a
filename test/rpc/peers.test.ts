import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { and, eq, isNull } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { KnowledgeEntrySchema, KnowledgeService } from "../../gen/meshwork/v1/knowledge_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { artifacts } from "../../src/db/schema/index.js";
import { outcome } from "../support/errors.js";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

let h: Harness;
beforeAll(async () => {
  h = await createHarness({ auth: "on" });
});
afterAll(() => h.close());

const peer = () => `peer-${uniqueWorkload()}`;

describe("workers named by peer_id", () => {
  it("registers a peer once and updates that same worker after; GetWorker finds it by peer_id", async () => {
    const fleet = h.as(FleetService, await h.token("worker"));
    const peerId = peer();
    const first = await fleet.registerWorker({ peerId, capabilities: ["a"] });
    const again = await fleet.registerWorker({
      peerId,
      capabilities: ["b"],
      labels: { region: "eu" },
      apiBaseUrl: "http://w.example/",
    });
    expect(again.workerId).toBe(first.workerId);
    const { worker } = await fleet.getWorker({ peerId });
    expect(worker).toMatchObject({
      workerId: first.workerId,
      peerId,
      capabilities: ["b"],
      labels: { region: "eu" },
      apiBaseUrl: "http://w.example/",
    });
  });

  it("makes one worker of registrations racing with one peer_id", async () => {
    const fleet = h.as(FleetService, await h.token("worker"));
    const peerId = peer();
    const ids = await Promise.all(
      Array.from({ length: 6 }, () => fleet.registerWorker({ peerId, capabilities: ["x"] })),
    );
    expect(new Set(ids.map((r) => r.workerId)).size).toBe(1);
  });

  it("finds a worker registered without a peer_id by its worker_id", async () => {
    const fleet = h.as(FleetService, await h.token("worker"));
    const { workerId } = await fleet.registerWorker({ name: "plain" });
    expect((await fleet.getWorker({ peerId: workerId })).worker?.workerId).toBe(workerId);
    expect(
      await outcome(fleet.getWorker({ peerId: "00000000-0000-4000-8000-000000000000" })),
    ).toMatchObject({ code: "NotFound" });
  });

  it("lets only the token that registered a peer update it; an admin may", async () => {
    const owner = h.as(FleetService, await h.token("worker"));
    const other = h.as(FleetService, await h.token("worker"));
    const admin = h.as(FleetService, await h.token("admin"));
    const peerId = peer();
    const { workerId } = await owner.registerWorker({ peerId, capabilities: ["mine"] });
    expect(await outcome(other.registerWorker({ peerId, capabilities: ["theirs"] }))).toMatchObject(
      { code: "PermissionDenied", reason: "FOREIGN_WORKER_TOKEN" },
    );
    expect((await owner.getWorker({ workerId })).worker?.capabilities).toEqual(["mine"]);
    await admin.registerWorker({ peerId, capabilities: ["set-by-admin"] });
    expect((await owner.getWorker({ workerId })).worker?.capabilities).toEqual(["set-by-admin"]);
  });

  it("refuses a bad peer_id, or worker_id and peer_id together, creating nothing", async () => {
    const fleet = h.as(FleetService, await h.token("admin"));
    const before = (await fleet.listWorkers({ pageSize: 1000 })).workers.length;
    const { workerId } = await fleet.registerWorker({ name: "x" });
    for (const bad of ["has space", "a/b", "x".repeat(257), "é", workerId]) {
      expect(await outcome(fleet.registerWorker({ peerId: bad }))).toMatchObject({
        code: "InvalidArgument",
      });
    }
    expect(await outcome(fleet.registerWorker({ workerId, peerId: peer() }))).toMatchObject({
      code: "InvalidArgument",
    });
    expect((await fleet.listWorkers({ pageSize: 1000 })).workers.length).toBe(before + 1);
  });
});

describe("ClaimTasks max_concurrency", () => {
  it("stands for the registered max_concurrency in that claim", async () => {
    const workload = uniqueWorkload();
    const admin = await h.token("admin");
    const fleet = h.as(FleetService, admin);
    const tasks = h.as(TaskService, admin);
    const leases = h.as(LeaseService, admin);
    const { workerId } = await fleet.registerWorker({ capabilities: [workload] });
    for (let i = 0; i < 5; i++) await tasks.createTask({ workload });
    // Registered with the default (1); the claim says 3.
    const first = await leases.claimTasks({ workerId, maxTasks: 5, maxConcurrency: 3 });
    expect(first.claims).toHaveLength(3);
    expect((await leases.claimTasks({ workerId, maxTasks: 5, maxConcurrency: 3 })).claims).toEqual(
      [],
    );
    expect((await leases.claimTasks({ workerId, maxTasks: 5 })).claims).toEqual([]);
    expect(
      (await leases.claimTasks({ workerId, maxTasks: 5, maxConcurrency: 4 })).claims,
    ).toHaveLength(1);
    for (const bad of [0, 10_001, -1]) {
      expect(await outcome(leases.claimTasks({ workerId, maxConcurrency: bad }))).toMatchObject({
        code: "InvalidArgument",
      });
    }
  });
});

describe("ImportKnowledge", () => {
  it("says why each rejected entry was refused, and takes an entry without updated_at as updated now", async () => {
    const knowledge = h.as(KnowledgeService, await h.token("client"));
    const kind = uniqueWorkload("kind");
    const entry = (key: string, extra: Record<string, unknown> = {}) =>
      create(KnowledgeEntrySchema, { kind, key, version: 1n, origin: "director-a", ...extra });
    const started = Date.now();
    const res = await knowledge.importKnowledge({
      entries: [
        entry("fine"),
        entry("", {}),
        entry("no-origin", { origin: "" }),
        entry("zero", { version: 0n }),
      ],
    });
    expect(res).toMatchObject({ inserted: 1n, rejected: 3n });
    expect(res.rejections.map((r) => [r.index, r.key, r.reason])).toEqual([
      [1, "", "key is required"],
      [2, "no-origin", "origin must not be empty"],
      [3, "zero", "version must be a positive integer"],
    ]);
    const { entry: stored } = await knowledge.getEntry({ kind, key: "fine" });
    const updatedAt = stored?.updatedAt;
    if (!updatedAt) throw new Error("the entry has no updated_at");
    expect(timestampDate(updatedAt).getTime()).toBeGreaterThanOrEqual(started - 1000);
  });

  it("explains the first 100 rejections and counts them all", async () => {
    const knowledge = h.as(KnowledgeService, await h.token("client"));
    const entries = Array.from({ length: 150 }, () => create(KnowledgeEntrySchema, { kind: "k" }));
    const res = await knowledge.importKnowledge({ entries });
    expect(res.rejected).toBe(150n);
    expect(res.rejections).toHaveLength(100);
    expect(res.rejections[99]?.index).toBe(99);
  });
});

describe("inline inputs of creates that do not use them", () => {
  it("keeps one INPUT artifact for 20 identical concurrent creates, none for a refused one", async () => {
    const tasks = h.as(TaskService, await h.token("client"));
    const key = `inline-${uniqueWorkload()}`;
    const data = new TextEncoder().encode(`input of ${key}`);
    const inputs = async () => {
      const rows = await h.db.database.db
        .select({ id: artifacts.id })
        .from(artifacts)
        .where(and(eq(artifacts.kind, "INPUT"), isNull(artifacts.taskId)));
      return rows.length;
    };
    const before = await inputs();
    const created = await Promise.all(
      Array.from({ length: 20 }, () =>
        tasks.createTask({
          workload: "inline",
          idempotencyKey: key,
          input: { case: "inputData", value: data },
        }),
      ),
    );
    expect(new Set(created.map((c) => c.task?.taskId)).size).toBe(1);
    expect(await inputs()).toBe(before + 1);
    // The same key with other content is refused: its input is not kept either.
    expect(
      await outcome(
        tasks.createTask({
          workload: "inline",
          idempotencyKey: key,
          priority: 5,
          input: { case: "inputData", value: data },
        }),
      ),
    ).toMatchObject({ code: "AlreadyExists" });
    expect(await inputs()).toBe(before + 1);
    // The task's own input artifact is still there.
    const { task } = await tasks.getTask({ taskId: created[0]?.task?.taskId ?? "" });
    const kept = await h
      .as(ArtifactService, await h.token("client"))
      .getArtifact({ artifactId: task?.input?.artifactId ?? "" });
    expect(kept.artifact?.sha256).toBe(task?.input?.sha256);
    // A batch refused at a later entry keeps none of the inputs it stored.
    expect(
      await outcome(
        tasks.createTasks({
          tasks: [
            { workload: "inline", input: { case: "inputData", value: data } },
            { workload: "inline", input: { case: "inputArtifactId", value: "not-a-uuid" } },
          ],
        }),
      ),
    ).toMatchObject({ code: "InvalidArgument" });
    expect(await inputs()).toBe(before + 1);
  });
});
