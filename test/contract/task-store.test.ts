import { beforeAll, describe, expect, it } from "vitest";
import { DomainError } from "../../src/core/errors.js";
import { decodeCursor } from "../../src/core/paging.js";
import { createTaskStore, type TaskStore } from "../../src/tasks/store.js";
import { describeEachEngine } from "../support/engines.js";
import { newTask } from "../support/fixtures.js";
import { uniqueWorkload } from "../support/harness.js";

describeEachEngine("task store", (db) => {
  /** The database of the engine being run (set before the first test). */
  const tdb = {
    get database() {
      return db();
    },
  };
  let store: TaskStore;

  beforeAll(async () => {
    store = createTaskStore(tdb.database.db);
  });

  describe("task store", () => {
    it("creates PENDING tasks at attempt 0 with every field kept", async () => {
      const deadline = new Date(Date.now() + 3_600_000);
      const [row] = await store.create([
        newTask({
          name: "embed",
          workload: "similarity-search",
          requiredCapabilities: ["gpu"],
          affinity: { region: "eu" },
          priority: 7,
          deadline,
          parameters: { query_id: "CHEMBL939", top_k: 20 },
          steps: 4,
          correlationId: "corr-1",
        }),
      ]);
      expect(row).toMatchObject({
        state: "PENDING",
        attempt: 0,
        name: "embed",
        workload: "similarity-search",
        requiredCapabilities: ["gpu"],
        affinity: { region: "eu" },
        priority: 7,
        deadline,
        parameters: { query_id: "CHEMBL939", top_k: 20 },
        steps: 4,
        correlationId: "corr-1",
      });
      expect(await store.get(row?.id as string)).toEqual(row);
    });

    it("returns the existing task for a repeated idempotency key with the same request", async () => {
      const key = `key-${uniqueWorkload()}`;
      const [first] = await store.create([newTask({ idempotencyKey: key, correlationId: "a" })]);
      const [again] = await store.create([newTask({ idempotencyKey: key, correlationId: "b" })]);
      expect(again?.id).toBe(first?.id);
    });

    it("refuses a reused idempotency key with a different request, creating nothing", async () => {
      const workload = uniqueWorkload();
      const key = `key-${workload}`;
      await store.create([newTask({ workload, idempotencyKey: key, priority: 1 })]);
      const attempt = store.create([
        newTask({ workload, name: "innocent" }),
        newTask({ workload, idempotencyKey: key, priority: 2 }),
      ]);
      await expect(attempt).rejects.toMatchObject({
        kind: "already_exists",
        reason: "IDEMPOTENCY_KEY_REUSED",
      });
      const { rows } = await store.list({ workload }, 100, undefined);
      expect(rows).toHaveLength(1); // the batch's other task was rolled back with it
      expect(rows[0]?.priority).toBe(1);
    });

    it("creates a batch in request order, repeated keys within it folded into one task", async () => {
      const workload = uniqueWorkload();
      const key = `key-${workload}`;
      const rows = await store.create([
        newTask({ workload, name: "a" }),
        newTask({ workload, name: "b", idempotencyKey: key }),
        newTask({ workload, name: "b", idempotencyKey: key }),
        newTask({ workload, name: "c" }),
      ]);
      expect(rows.map((r) => r.name)).toEqual(["a", "b", "b", "c"]);
      expect(rows[1]?.id).toBe(rows[2]?.id);
    });

    it("answers each created task as a read of it gives it, whatever the request set", async () => {
      const workload = uniqueWorkload();
      const every = (name: string) =>
        newTask({
          name,
          workload,
          requiredCapabilities: ["gpu", "cuda-12"],
          affinity: { region: "eu", rack: "r7" },
          priority: -3,
          deadline: new Date(Date.now() + 3_600_123),
          parameters: { query: "CHEMBL939", top_k: 20, nested: { list: [1, "two", null] } },
          steps: 9,
          maxAttempts: 5,
          leaseSeconds: 120,
          backoff: { initialMs: 250, maxMs: 9_000, multiplier: 1.5 },
          correlationId: `corr-${name}`,
          traceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
          traceState: "vendor=x",
          resources: { slots: 2, gpu: 1, memory_mb: 2048 },
          requirements: [{ key: "zone", op: "In", values: ["a", "b"] }],
          preferences: [{ key: "ssd", op: "Exists", values: [], weight: 10 }],
          share: "lab/imaging",
          shareGiven: true,
          concurrencyKey: "acct-1",
          rateKey: "api",
          runAt: new Date(Date.now() + 60_000),
          timeoutSeconds: 300,
          dependencyPolicy: "ALL_DONE",
          dispatch: true,
        });
      const batches = [
        // No key, no dependency: the insert alone.
        [
          every("plain"),
          newTask({ workload, delayMs: 5_000 }),
          newTask({ workload }),
          // The usual values the fixture does not give (the insert leaves them out).
          newTask({ workload, name: "", scheduleId: "0190a0b0-0000-7000-8000-000000000001" }),
        ],
        // Keys: the insert in a transaction, a repeat found by its key.
        [
          { ...every("keyed"), idempotencyKey: `key-${workload}` },
          newTask({ workload, idempotencyKey: `other-${workload}` }),
        ],
        [newTask({ workload, idempotencyKey: `other-${workload}` })],
        // Dependencies: the rows read again after their edges.
        [{ ...every("first"), ref: "a" }, newTask({ workload, ref: "b", dependsOn: ["ref:a"] })],
      ];
      for (const batch of batches) {
        const rows = await store.create(batch);
        expect(rows).toHaveLength(batch.length);
        for (const row of rows) expect(await store.get(row.id)).toEqual(row);
      }
    });

    it("lists newest first with filters and stable page tokens", async () => {
      const workload = uniqueWorkload();
      const created = [];
      for (let i = 0; i < 5; i++) {
        // Times are kept to the millisecond: tasks created within the same
        // one are listed by id, so the test leaves a millisecond between them.
        if (i > 0) await new Promise((r) => setTimeout(r, 2));
        created.push(
          ...(await store.create([
            newTask({ workload, name: `n${i}`, correlationId: i % 2 ? "odd" : "even" }),
          ])),
        );
      }
      const seen: string[] = [];
      let token: string | undefined;
      do {
        const page = await store.list({ workload }, 2, token ? decodeCursor(token) : undefined);
        seen.push(...page.rows.map((r) => r.name));
        token = page.next || undefined;
      } while (token);
      expect(seen).toEqual(["n4", "n3", "n2", "n1", "n0"]);
      const odd = await store.list({ workload, correlationId: "odd" }, 100, undefined);
      expect(odd.rows.map((r) => r.name)).toEqual(["n3", "n1"]);
      const none = await store.list({ workload, state: "RUNNING" }, 100, undefined);
      expect(none.rows).toEqual([]);
    });

    it("reads text back as stored, a leading U+FEFF included, by id and in a list", async () => {
      // PGlite's own reader drops a byte order mark at the start of a text
      // value; the same task must read the same from every path, as on PostgreSQL.
      const workload = uniqueWorkload();
      const bom = "\ufeff";
      const [row] = await store.create([
        newTask({
          workload,
          name: `${bom}name`,
          correlationId: `${bom}corr`,
          requiredCapabilities: [`${bom}cap`],
          parameters: { text: `${bom}value` },
        }),
      ]);
      const expected = {
        name: `${bom}name`,
        correlationId: `${bom}corr`,
        requiredCapabilities: [`${bom}cap`],
        parameters: { text: `${bom}value` },
      };
      expect(row).toMatchObject(expected);
      expect(await store.get(row?.id as string)).toMatchObject(expected);
      const listed = await store.list({ workload }, 10, undefined);
      expect(listed.rows).toHaveLength(1);
      expect(listed.rows[0]).toMatchObject(expected);
      // The filter matches the stored text, BOM and all.
      const byCorrelation = await store.list(
        { workload, correlationId: `${bom}corr` },
        10,
        undefined,
      );
      expect(byCorrelation.rows.map((r) => r.id)).toEqual([row?.id]);
    });

    it("cancels a PENDING task and refuses to cancel a terminal one", async () => {
      const [row] = await store.create([newTask({ workload: uniqueWorkload() })]);
      const id = row?.id as string;
      const canceled = await store.cancel(id, "no longer needed");
      expect(canceled).toMatchObject({
        state: "CANCELED",
        cancelRequested: true,
        errorMessage: "no longer needed",
      });
      expect(canceled.finishedAt).toBeInstanceOf(Date);
      const again = store.cancel(id, "twice");
      await expect(again).rejects.toBeInstanceOf(DomainError);
      await expect(again).rejects.toMatchObject({ kind: "failed_precondition" });
      expect((await store.get(id)).errorMessage).toBe("no longer needed");
    });

    it("answers not_found for an unknown task", async () => {
      await expect(store.get("00000000-0000-4000-8000-000000000000")).rejects.toMatchObject({
        kind: "not_found",
      });
    });

    it("counts tasks by state and reports the backlog per workload", async () => {
      const workload = uniqueWorkload();
      await store.create([newTask({ workload }), newTask({ workload })]);
      const counts = await store.countByState();
      expect(counts.get("PENDING")).toBeGreaterThanOrEqual(2);
      const backlog = await store.backlog();
      const mine = backlog.find((b) => b.workload === workload);
      expect(mine?.count).toBe(2);
      expect(mine?.now.getTime()).toBeGreaterThanOrEqual(mine?.oldest.getTime() ?? Number.NaN);
    });
  });
});
