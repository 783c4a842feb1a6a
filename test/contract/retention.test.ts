import { randomUUID } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inArray, sql } from "drizzle-orm";
import { beforeAll, describe, expect, it } from "vitest";
import { createPostgresBlobStore } from "../../src/artifacts/blob-postgres.js";
import { type BlobStore, createFileBlobStore } from "../../src/artifacts/blob-store.js";
import { blobLockClass, createArtifactStore } from "../../src/artifacts/store.js";
import type { Db } from "../../src/db/database.js";
import { connectPostgres } from "../../src/db/postgres-client.js";
import {
  type ArtifactKindName,
  type ArtifactRefJson,
  artifacts,
  type TaskStateName,
  tasks,
} from "../../src/db/schema/index.js";
import { rowsOf } from "../../src/db/values.js";
import { createRetention, retentionLockKey } from "../../src/tasks/retention.js";
import { createTaskStore } from "../../src/tasks/store.js";
import { chunks } from "../support/blob-store-contract.js";
import { createTestDatabase, onPostgres } from "../support/database.js";
import { describeEachEngine } from "../support/engines.js";
import { newTask } from "../support/fixtures.js";

const day = 86_400_000;

/** A logger that keeps what it was told. */
function captureLog() {
  const lines: { level: string; fields: unknown; msg: unknown }[] = [];
  const at =
    (level: string) =>
    (fields: unknown, msg?: unknown): void => {
      lines.push({ level, fields, msg });
    };
  return {
    lines,
    log: { info: at("info"), debug: at("debug"), warn: at("warn"), error: at("error") },
  };
}

/** Tasks, artifacts and blobs on one database, as retention finds them. */
function world(db: Db, blobs: BlobStore) {
  const taskStore = createTaskStore(db);
  const artifactStore = createArtifactStore(db);
  return {
    /** Stores `bytes` and an artifact row naming them. */
    async artifact(taskId: string | null, kind: ArtifactKindName, bytes: string) {
      const staged = await blobs.stage(chunks(bytes), 1 << 20);
      await staged.commit();
      return artifactStore.insert(
        {
          taskId,
          attempt: taskId ? 1 : 0,
          workerId: null,
          filename: "f",
          contentType: "",
          kind,
          sha256: staged.sha256,
          sizeBytes: staged.size,
        },
        null,
      );
    },
    /** A task in `state`, finished `ageMs` ago (terminal) or created then (others). */
    async task(state: TaskStateName, ageMs: number, input: ArtifactRefJson | null = null) {
      const [row] = await taskStore.create([newTask({ input })]);
      if (!row) throw new Error("no task");
      const terminal = ["SUCCEEDED", "FAILED", "CANCELED"].includes(state);
      await db
        .update(tasks)
        .set({
          state,
          createdAt: sql`now() - make_interval(secs => ${ageMs / 1000}::float8)`,
          finishedAt: terminal ? sql`now() - make_interval(secs => ${ageMs / 1000}::float8)` : null,
        })
        .where(sql`${tasks.id} = ${row.id}`);
      return row.id;
    },
    async tasksLeft(ids: string[]): Promise<string[]> {
      const rows = await db.select({ id: tasks.id }).from(tasks).where(inArray(tasks.id, ids));
      return rows.map((r) => r.id).sort();
    },
    async artifactsLeft(ids: string[]): Promise<string[]> {
      const rows = await db
        .select({ id: artifacts.id })
        .from(artifacts)
        .where(inArray(artifacts.id, ids));
      return rows.map((r) => r.id).sort();
    },
  };
}

const refOf = (a: { id: string; sha256: string; sizeBytes: number }): ArtifactRefJson => ({
  artifactId: a.id,
  uri: `http://x/v1/artifacts/${a.id}`,
  sha256: a.sha256,
  sizeBytes: a.sizeBytes,
  contentType: "",
});

describeEachEngine("retention", (database) => {
  let blobs: BlobStore;
  let w: ReturnType<typeof world>;
  const retention = (
    retentionMs: number,
    more: { batchSize?: number; maxBatches?: number } = {},
  ) => {
    const { log, lines } = captureLog();
    return {
      lines,
      r: createRetention({ db: database().housekeeping, blobs, log }, { retentionMs, ...more }),
    };
  };

  beforeAll(() => {
    blobs = createFileBlobStore(mkdtempSync(join(tmpdir(), "meshwork-retention-")));
    w = world(database().db, blobs);
  });

  it("deletes old finished tasks with their artifacts and unshared bytes, keeps recent and unfinished ones", async () => {
    const old = [
      await w.task("SUCCEEDED", 8 * day),
      await w.task("FAILED", 8 * day),
      await w.task("CANCELED", 30 * day),
    ];
    const recent = await w.task("SUCCEEDED", 6 * day);
    const unfinished = [
      await w.task("PENDING", 60 * day),
      await w.task("RUNNING", 60 * day),
      await w.task("ASSIGNED", 60 * day),
    ];
    // A PENDING task with a finished_at from an earlier life is still kept.
    await database()
      .db.update(tasks)
      .set({ finishedAt: sql`now() - interval '60 days'` })
      .where(sql`${tasks.id} = ${unfinished[0]}`);
    const oldOutput = await w.artifact(old[0] ?? "", "OUTPUT", `old output ${randomUUID()}`);
    const oldCheckpoint = await w.artifact(old[1] ?? "", "CHECKPOINT", `old cp ${randomUUID()}`);
    const recentOutput = await w.artifact(recent, "OUTPUT", `recent output ${randomUUID()}`);
    const runningOutput = await w.artifact(
      unfinished[1] ?? "",
      "OUTPUT",
      `running ${randomUUID()}`,
    );

    const { r, lines } = retention(7 * day);
    const run = await r.runOnce();
    expect(run).toMatchObject({ ran: true, blobsFailed: 0 });
    expect(run.tasks).toBeGreaterThanOrEqual(3);

    expect(await w.tasksLeft([...old, recent, ...unfinished])).toEqual(
      [recent, ...unfinished].sort(),
    );
    expect(
      await w.artifactsLeft([oldOutput.id, oldCheckpoint.id, recentOutput.id, runningOutput.id]),
    ).toEqual([recentOutput.id, runningOutput.id].sort());
    expect(await blobs.has(oldOutput.sha256)).toBe(false);
    expect(await blobs.has(oldCheckpoint.sha256)).toBe(false);
    expect(await blobs.has(recentOutput.sha256)).toBe(true);
    expect(await blobs.has(runningOutput.sha256)).toBe(true);

    // One line for the run, with counts only.
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: "info", msg: "retention: deleted finished tasks" });
    expect(Object.keys(lines[0]?.fields as object).sort()).toEqual(
      ["artifacts", "batches", "blobs", "blobsFailed", "tasks"].sort(),
    );
  });

  it("keeps bytes another artifact row still names, and an input another task still names", async () => {
    const bytes = `shared ${randomUUID()}`;
    const oldTask = await w.task("SUCCEEDED", 8 * day);
    const recentTask = await w.task("SUCCEEDED", 1 * day);
    const oldOutput = await w.artifact(oldTask, "OUTPUT", bytes);
    const recentOutput = await w.artifact(recentTask, "OUTPUT", bytes);
    expect(recentOutput.sha256).toBe(oldOutput.sha256);

    // One input named by an old task and by a live one; another only by an old one.
    const sharedInput = await w.artifact(null, "INPUT", `input ${randomUUID()}`);
    const ownInput = await w.artifact(null, "INPUT", `own input ${randomUUID()}`);
    const oldReader = await w.task("FAILED", 9 * day, refOf(sharedInput));
    const liveReader = await w.task("PENDING", 9 * day, refOf(sharedInput));
    const oldOwner = await w.task("SUCCEEDED", 9 * day, refOf(ownInput));

    await retention(7 * day).r.runOnce();

    expect(await w.tasksLeft([oldTask, recentTask, oldReader, liveReader, oldOwner])).toEqual(
      [recentTask, liveReader].sort(),
    );
    expect(
      await w.artifactsLeft([oldOutput.id, recentOutput.id, sharedInput.id, ownInput.id]),
    ).toEqual([recentOutput.id, sharedInput.id].sort());
    expect(await blobs.has(oldOutput.sha256)).toBe(true);
    expect(await blobs.has(sharedInput.sha256)).toBe(true);
    expect(await blobs.has(ownInput.sha256)).toBe(false);
  });

  it("keeps a finished task while another task names one of its artifacts as input", async () => {
    const producer = await w.task("SUCCEEDED", 8 * day);
    const output = await w.artifact(producer, "OUTPUT", `produced ${randomUUID()}`);
    const consumer = await w.task("PENDING", 0, refOf(output));
    await retention(7 * day).r.runOnce();
    expect(await w.tasksLeft([producer, consumer])).toEqual([producer, consumer].sort());
    expect(await w.artifactsLeft([output.id])).toEqual([output.id]);
    expect(await blobs.has(output.sha256)).toBe(true);
  });

  it("keeps everything with a retention of 0", async () => {
    const old = await w.task("SUCCEEDED", 3650 * day);
    const output = await w.artifact(old, "OUTPUT", `kept ${randomUUID()}`);
    const { r, lines } = retention(0);
    expect(await r.runOnce()).toMatchObject({ ran: false, tasks: 0 });
    expect(lines).toEqual([]);
    expect(await w.tasksLeft([old])).toEqual([old]);
    expect(await blobs.has(output.sha256)).toBe(true);
    await retention(7 * day).r.runOnce();
  });

  it("deletes in batches, at most maxBatches per run, oldest first", async () => {
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push(await w.task("SUCCEEDED", (10 + i) * day));
    const { r } = retention(7 * day, { batchSize: 2, maxBatches: 2 });
    expect(await r.runOnce()).toMatchObject({ tasks: 4, batches: 2 });
    // The youngest of the five is left for the next run.
    expect(await w.tasksLeft(ids)).toEqual([ids[0]]);
    expect(await r.runOnce()).toMatchObject({ tasks: 1, batches: 1 });
    expect(await w.tasksLeft(ids)).toEqual([]);
  });

  it("refuses an upload's row when the bytes it matched were removed meanwhile", async () => {
    const staged = await blobs.stage(chunks(`removed ${randomUUID()}`), 1000);
    await staged.commit();
    const store = createArtifactStore(database().db);
    const row = {
      taskId: null,
      attempt: 0,
      workerId: null,
      filename: "in",
      contentType: "",
      kind: "INPUT" as const,
      sha256: staged.sha256,
      sizeBytes: staged.size,
    };
    await blobs.remove?.(staged.sha256);
    await expect(store.insert(row, null, () => blobs.has(staged.sha256))).rejects.toMatchObject({
      kind: "aborted",
      reason: "ARTIFACT_BYTES_REMOVED",
    });
    const left = await rowsOf(
      database().db,
      sql`select 1 from artifacts where sha256 = ${staged.sha256}`,
    );
    expect(left).toEqual([]);
  });

  it("logs a run that deleted nothing at debug level only", async () => {
    const { r, lines } = retention(7 * day);
    expect(await r.runOnce()).toMatchObject({ ran: true, tasks: 0 });
    expect(lines.map((l) => l.level)).toEqual(["debug"]);
  });
});

describe.skipIf(!onPostgres)("retention on PostgreSQL replicas", () => {
  it("does nothing while another replica holds the lock, and one replica deletes each task once", async () => {
    const tdb = await createTestDatabase();
    const other = await tdb.reopen();
    const holder = connectPostgres(tdb.url ?? "", { max: 1, onnotice: () => {} });
    try {
      const blobs = createFileBlobStore(mkdtempSync(join(tmpdir(), "meshwork-retention-")));
      const w = world(tdb.database.db, blobs);
      const ids: string[] = [];
      for (let i = 0; i < 6; i++) ids.push(await w.task("SUCCEEDED", 8 * day));
      const log = captureLog().log;
      const a = createRetention(
        { db: tdb.database.housekeeping, blobs, log },
        { retentionMs: 7 * day, batchSize: 1 },
      );
      const b = createRetention(
        { db: other.housekeeping, blobs, log },
        { retentionMs: 7 * day, batchSize: 1 },
      );

      await holder`select pg_advisory_lock(${retentionLockKey})`;
      expect(await a.runOnce()).toMatchObject({ ran: false, tasks: 0 });
      expect(await w.tasksLeft(ids)).toHaveLength(6);
      await holder`select pg_advisory_unlock(${retentionLockKey})`;

      // Two replicas at once: whichever holds the lock deletes, the other
      // skips or finds nothing left; every task goes exactly once.
      const [ra, rb] = await Promise.all([a.runOnce(), b.runOnce()]);
      expect((ra?.tasks ?? 0) + (rb?.tasks ?? 0)).toBe(6);
      expect(await w.tasksLeft(ids)).toEqual([]);
      // The lock is released after a run: the holder can take it.
      const [row] = await holder`select pg_try_advisory_lock(${retentionLockKey}) as locked`;
      expect(row?.locked).toBe(true);
    } finally {
      await holder.end();
      await tdb.drop();
    }
  });

  it("an upload committing a row for bytes being removed waits for the removal, then is refused", async () => {
    const tdb = await createTestDatabase();
    const holder = connectPostgres(tdb.url ?? "", { max: 1, onnotice: () => {} });
    try {
      const blobs = createFileBlobStore(mkdtempSync(join(tmpdir(), "meshwork-retention-")));
      const staged = await blobs.stage(chunks("bytes being removed"), 1000);
      await staged.commit();
      // Retention in the middle of removing them: the blob's lock held exclusive.
      const retention = await holder.reserve();
      await retention`begin`;
      await retention`select pg_advisory_xact_lock(${blobLockClass}::int, hashtext(${staged.sha256}))`;
      const store = createArtifactStore(tdb.database.db);
      const insert = store.insert(
        {
          taskId: null,
          attempt: 0,
          workerId: null,
          filename: "in",
          contentType: "",
          kind: "INPUT",
          sha256: staged.sha256,
          sizeBytes: staged.size,
        },
        null,
        () => blobs.has(staged.sha256),
      );
      let settled = false;
      insert.then(
        () => (settled = true),
        () => (settled = true),
      );
      await new Promise((r) => setTimeout(r, 300));
      expect(settled).toBe(false);
      await blobs.remove?.(staged.sha256);
      await retention`commit`;
      retention.release();
      await expect(insert).rejects.toMatchObject({ reason: "ARTIFACT_BYTES_REMOVED" });
    } finally {
      await holder.end();
      await tdb.drop();
    }
  });

  it("removes unshared bytes from the PostgreSQL blob store, chunks included", async () => {
    const tdb = await createTestDatabase();
    try {
      const db = tdb.database.db;
      const blobs = createPostgresBlobStore(db, { chunkBytes: 4 });
      const w = world(db, blobs);
      const old = await w.task("SUCCEEDED", 8 * day);
      const kept = await w.task("SUCCEEDED", 1 * day);
      const gone = await w.artifact(old, "OUTPUT", "bytes of the old task");
      const shared = await w.artifact(old, "OUTPUT", "bytes shared with a recent task");
      await w.artifact(kept, "OUTPUT", "bytes shared with a recent task");
      const r = createRetention(
        { db: tdb.database.housekeeping, blobDb: db, blobs, log: captureLog().log },
        { retentionMs: 7 * day },
      );
      expect(await r.runOnce()).toMatchObject({ tasks: 1, artifacts: 2, blobs: 1 });
      expect(await blobs.has(gone.sha256)).toBe(false);
      expect(await blobs.has(shared.sha256)).toBe(true);
      const [chunksLeft] = await rowsOf<{ n: number }>(
        db,
        sql`select count(*)::int as n from blob_chunks`,
      );
      // "bytes shared with a recent task": 32 bytes in chunks of 4.
      expect(chunksLeft?.n).toBe(8);
    } finally {
      await tdb.drop();
    }
  });
});

describeEachEngine("retention of inputs no task names", (database, engine) => {
  it("deletes an INPUT artifact no task names once older than the retention, with its bytes; keeps a younger one and a named one", async () => {
    const blobs = createFileBlobStore(mkdtempSync(join(tmpdir(), "meshwork-orphans-")));
    const w = world(database().db, blobs);
    const aged = async (a: { id: string }, ageMs: number) =>
      database()
        .db.update(artifacts)
        .set({ createdAt: sql`now() - make_interval(secs => ${ageMs / 1000}::float8)` })
        .where(sql`${artifacts.id} = ${a.id}`);
    const unused = await w.artifact(null, "INPUT", `never used ${randomUUID()}`);
    const young = await w.artifact(null, "INPUT", `uploaded today ${randomUUID()}`);
    const named = await w.artifact(null, "INPUT", `still named ${randomUUID()}`);
    await aged(unused, 8 * day);
    await aged(named, 8 * day);
    await aged(young, 1 * day);
    await w.task("PENDING", 8 * day, refOf(named));
    const { log } = captureLog();
    const r = createRetention(
      { db: database().housekeeping, blobs, log },
      { retentionMs: 7 * day },
    );
    expect(await r.runOnce()).toMatchObject({ orphanInputs: 1, artifacts: 1, blobs: 1 });
    expect(await w.artifactsLeft([unused.id, young.id, named.id])).toEqual(
      [young.id, named.id].sort(),
    );
    expect(await blobs.has(unused.sha256)).toBe(false);
    expect(await blobs.has(young.sha256)).toBe(true);
    expect(await blobs.has(named.sha256)).toBe(true);

    // A create naming the input retention took is refused, never acknowledged
    // with an input that no longer exists; nothing is created.
    const store = createTaskStore(database().db);
    const workload = `orphan-${randomUUID()}`;
    await expect(store.create([newTask({ workload, input: refOf(unused) })])).rejects.toMatchObject(
      { kind: "not_found" },
    );
    const [left] = await rowsOf<{ n: number }>(
      database().db,
      sql`select count(*)::int as n from tasks where workload = ${workload}`,
    );
    expect(left?.n).toBe(0);
  });

  // Two sessions at once: PostgreSQL only (PGlite has one connection).
  it.skipIf(engine.name !== "postgres")(
    "skips an input a create holds until the task naming it commits, and keeps it after",
    async () => {
      const blobs = createFileBlobStore(mkdtempSync(join(tmpdir(), "meshwork-orphans-")));
      const w = world(database().db, blobs);
      const input = await w.artifact(null, "INPUT", `being named ${randomUUID()}`);
      await database()
        .db.update(artifacts)
        .set({ createdAt: sql`now() - make_interval(secs => ${8 * 86_400}::float8)` })
        .where(sql`${artifacts.id} = ${input.id}`);
      const r = createRetention(
        { db: database().housekeeping, blobs, log: captureLog().log },
        { retentionMs: 7 * day },
      );
      // The create's transaction: the input locked, the task inserted, not yet committed.
      let release: () => void = () => {};
      const held = new Promise<void>((resolve) => {
        release = resolve;
      });
      let locked: () => void = () => {};
      const isLocked = new Promise<void>((resolve) => {
        locked = resolve;
      });
      const create = database().db.transaction(async (tx) => {
        await tx.execute(sql`select id from artifacts where id = ${input.id} for key share`);
        locked();
        await held;
        await createTaskStore(tx as unknown as Db).create([newTask({ input: refOf(input) })]);
      });
      await isLocked;
      expect(await r.runOnce()).toMatchObject({ orphanInputs: 0 });
      release();
      await create;
      expect(await r.runOnce()).toMatchObject({ orphanInputs: 0 });
      expect(await w.artifactsLeft([input.id])).toEqual([input.id]);
    },
  );
});
