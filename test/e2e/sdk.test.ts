import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { DescService } from "@bufbuild/protobuf";
import {
  type Client,
  Code,
  ConnectError,
  createClient,
  type Interceptor,
} from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import type { ClaimTasksResponse, CompleteTasksResponse } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import type { App } from "../../src/app.js";
import {
  createWorker,
  LeaseEndedError,
  TaskError,
  type Worker,
  type WorkerOptions,
} from "../../src/sdk/worker.js";
import { listen, type RunningServer } from "../../src/server.js";
import { until, within } from "../support/bounded.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { appOn, uniqueWorkload } from "../support/harness.js";
import { freePort } from "../support/serve.js";

// The worker SDK (src/sdk, `meshwork/worker`) against a real coordinator with
// auth on, over gRPC on h2c. The coordinator listens on a fixed port so that
// it can be restarted under a running worker.

const sha = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");

/** A meeting point: each call waits until `n` calls have been made, then all go on. */
function barrier(n: number): () => Promise<void> {
  let arrived = 0;
  let release: () => void = () => {};
  const all = new Promise<void>((r) => {
    release = r;
  });
  return () => {
    if (++arrived === n) release();
    return all;
  };
}

describe("the worker SDK against a coordinator with auth on", () => {
  let tdb: TestDatabase;
  let app: App;
  let server: RunningServer | undefined;
  let port = 0;
  let url = "";
  let adminToken = "";
  let workerToken = "";
  const blobDir = mkdtempSync(join(tmpdir(), "meshwork-sdk-blobs-"));
  const workers: Worker[] = [];

  const start = async () => {
    app = appOn(tdb.database, { auth: "on", blobDir, publicUrl: url });
    server = await listen(app, `127.0.0.1:${port}`);
  };

  beforeAll(async () => {
    port = await freePort();
    url = `http://127.0.0.1:${port}`;
    tdb = await createTestDatabase();
    await start();
    adminToken = (await app.tokens.create("sdk-admin", "admin")).secret;
    workerToken = (await app.tokens.create("sdk-worker", "worker")).secret;
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop().catch(() => {})));
    await server?.close();
    await tdb.drop();
  });

  function as<S extends DescService>(service: S): Client<S> {
    return createClient(
      service,
      createConnectTransport({
        baseUrl: url,
        httpVersion: "1.1",
        interceptors: [
          (next) => (req) => {
            req.header.set("authorization", `Bearer ${adminToken}`);
            return next(req);
          },
        ],
      }),
    );
  }
  const tasks = () => as(TaskService);

  /** Calls the worker made, by method name, with the task ids of completions. */
  interface Calls {
    count: Map<string, number>;
    completed: string[];
    interceptor: Interceptor;
  }
  function recorder(): Calls {
    const calls: Calls = {
      count: new Map(),
      completed: [],
      interceptor: (next) => async (req) => {
        calls.count.set(req.method.name, (calls.count.get(req.method.name) ?? 0) + 1);
        if (!req.stream) {
          const m = req.message as {
            taskId?: string;
            completions?: { taskId: string }[];
          };
          if (req.method.name === "CompleteTask" && m.taskId) calls.completed.push(m.taskId);
          if (req.method.name === "CompleteTasks") {
            for (const c of m.completions ?? []) calls.completed.push(c.taskId);
          }
        }
        return next(req);
      },
    };
    return calls;
  }

  function worker(
    options: Pick<WorkerOptions, "workloads" | "handler"> & Partial<WorkerOptions>,
    logs: string[] = [],
  ): Worker {
    const w = createWorker({
      url,
      token: workerToken,
      pollSeconds: 2,
      installSignalHandlers: false,
      log: (m) => logs.push(m),
      ...options,
    });
    workers.push(w);
    return w;
  }

  it("runs several tasks at once: input checked, results uploaded, completed together in one CompleteTasks", async () => {
    const workload = uniqueWorkload("sdk-happy");
    const created = await Promise.all(
      ["a", "b", "c"].map(async (s) => {
        const { task } = await tasks().createTask({
          workload,
          input: { case: "inputData", value: new TextEncoder().encode(`hello ${s}`) },
          parameters: { suffix: "!" },
        });
        return task?.taskId ?? "";
      }),
    );
    const calls = recorder();
    const together = barrier(3);
    const logs: string[] = [];
    const w = worker(
      {
        workloads: [workload],
        concurrency: 3,
        // Each task sends its last progress before it completes; on a loaded
        // machine those three calls return further apart than the default
        // 20 ms window, and the completions would go in two batches. A wide
        // window keeps the test about batching, not about the machine's speed.
        completionBatchMs: 1000,
        interceptors: [calls.interceptor],
        handler: async (task, ctx) => {
          const input = new TextDecoder().decode(await ctx.input());
          const out = `${input.toUpperCase()}${String(ctx.parameters.suffix)}`;
          const artifact = await ctx.upload("out.txt", out, { contentType: "text/plain" });
          ctx.progress(1, "uploaded");
          await together(); // all three finish together
          return { result: artifact, summary: `did ${task.id}`, metrics: { n: 1 } };
        },
      },
      logs,
    );
    await w.ready;
    for (const taskId of created) {
      await until(async () => {
        const { task } = await tasks().getTask({ taskId });
        return task?.state === TaskState.SUCCEEDED;
      });
    }
    for (const [i, taskId] of created.entries()) {
      const { task } = await tasks().getTask({ taskId });
      const expected = `HELLO ${"ABC"[i]}!`;
      expect(task?.result?.sha256, logs.join("\n")).toBe(sha(expected));
      expect(task?.result?.contentType).toBe("text/plain");
      expect(task?.resultSummary).toBe(`did ${taskId}`);
      expect(task?.attempt).toBe(1);
    }
    expect(calls.count.get("CompleteTasks"), logs.join("\n")).toBe(1);
    expect(calls.count.get("CompleteTask") ?? 0).toBe(0);
    expect(calls.completed.sort()).toEqual([...created].sort());
    expect(calls.count.get("RegisterWorker")).toBe(1);
    await w.stop();
    expect(calls.count.get("DeregisterWorker")).toBe(1);
    // Deregistered, never drained: a restart with the same peer_id would find it drained.
    expect(calls.count.get("DrainWorker") ?? 0).toBe(0);
  }, 30_000);

  it("runs task after task at its cap without piling up listeners (no MaxListenersExceededWarning)", async () => {
    const workload = uniqueWorkload("sdk-cap");
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on("warning", onWarning);
    try {
      const ids: string[] = [];
      for (let i = 0; i < 14; i++) {
        const { task } = await tasks().createTask({ workload });
        ids.push(task?.taskId ?? "");
      }
      let done = 0;
      const w = worker({
        workloads: [workload],
        concurrency: 1,
        async handler() {
          // Long enough for the claim loop to wait for the slot each time.
          await new Promise((r) => setTimeout(r, 30));
          done++;
          return {};
        },
      });
      await until(() => done === ids.length, 30_000);
      await w.stop();
      await new Promise((r) => setImmediate(r));
      expect(warnings.filter((m) => m.includes("MaxListeners"))).toEqual([]);
    } finally {
      process.off("warning", onWarning);
    }
  });

  it("fails a task whose handler throws: retried while retryable, FAILED once a TaskError says not to", async () => {
    const workload = uniqueWorkload("sdk-throw");
    const { task: created } = await tasks().createTask({
      workload,
      maxAttempts: 3,
      retryBackoff: { initial: { seconds: 0n } },
    });
    const taskId = created?.taskId ?? "";
    const attempts: number[] = [];
    const w = worker({
      workloads: [workload],
      handler: (task) => {
        attempts.push(task.attempt);
        if (task.attempt === 1) throw new Error("boom");
        throw new TaskError("BadInput", "cannot be done", { retryable: false });
      },
    });
    await until(async () => {
      const { task } = await tasks().getTask({ taskId });
      return task?.state === TaskState.FAILED;
    });
    const { task } = await tasks().getTask({ taskId });
    expect(attempts).toEqual([1, 2]);
    expect(task?.attempt).toBe(2);
    expect(task?.error?.code).toBe("BadInput");
    expect(task?.error?.message).toContain("cannot be done");
    await w.stop();
  }, 30_000);

  it("aborts the handler's signal when the lease is lost, and sends no late completion", async () => {
    const workload = uniqueWorkload("sdk-lost");
    const { task: created } = await tasks().createTask({
      workload,
      leaseSeconds: 5,
      maxAttempts: 1,
    });
    const taskId = created?.taskId ?? "";
    const calls = recorder();
    let started = false;
    let reason: unknown;
    let returned = false;
    const w = worker({
      workloads: [workload],
      interceptors: [calls.interceptor],
      handler: async (_task, ctx) => {
        started = true;
        await new Promise<void>((r) => ctx.signal.addEventListener("abort", () => r()));
        reason = ctx.signal.reason;
        returned = true;
        return { summary: "too late" };
      },
    });
    await until(() => started);
    // Expire the lease by the database clock: the next renewal is refused.
    await tdb.database.db.execute(
      sql`update tasks set lease_expires_at = now() - interval '1 second' where id = ${taskId}`,
    );
    await until(() => returned);
    expect(reason).toBeInstanceOf(LeaseEndedError);
    expect((reason as LeaseEndedError).kind).toBe("lost");
    await new Promise((r) => setTimeout(r, 300)); // room for a completion that must not come
    expect(calls.completed).not.toContain(taskId);
    expect(calls.count.get("FailTask") ?? 0).toBe(0);
    expect(calls.count.get("RenewLease") ?? 0).toBe(0); // the stream said so
    await until(async () => {
      const { task } = await tasks().getTask({ taskId });
      return task?.state === TaskState.FAILED; // the sweeper, not the worker
    });
    const { task } = await tasks().getTask({ taskId });
    expect(task?.error?.code).toBe("LEASE_EXPIRED");
    await w.stop();
  }, 30_000);

  it("aborts the handler's signal when the task is cancelled", async () => {
    const workload = uniqueWorkload("sdk-cancel");
    const { task: created } = await tasks().createTask({ workload, leaseSeconds: 5 });
    const taskId = created?.taskId ?? "";
    let started = false;
    let reason: unknown;
    const w = worker({
      workloads: [workload],
      handler: async (_task, ctx) => {
        started = true;
        await new Promise<void>((r) => ctx.signal.addEventListener("abort", () => r()));
        reason = ctx.signal.reason;
      },
    });
    await until(() => started);
    await tasks().cancelTask({ taskId, reason: "not needed" });
    await until(() => reason !== undefined);
    expect((reason as LeaseEndedError).kind).toBe("canceled");
    const { task } = await tasks().getTask({ taskId });
    expect(task?.state).toBe(TaskState.CANCELED);
    await w.stop();
  }, 30_000);

  it("stops gracefully (onStop drain): drained at once, a handler that finishes within the grace completes, the other is released with its checkpoint; registered again, it says it is drained", async () => {
    const workload = uniqueWorkload("sdk-stop");
    const quick = (await tasks().createTask({ workload, name: "quick" })).task?.taskId ?? "";
    const slow = (await tasks().createTask({ workload, name: "slow" })).task?.taskId ?? "";
    const calls = recorder();
    const running = new Set<string>();
    let stopAsked = false;
    let slowReason: unknown;
    const peerId = `peer-${workload}`;
    const w = worker({
      workloads: [workload],
      concurrency: 2,
      graceMs: 1500,
      onStop: "drain",
      peerId,
      interceptors: [calls.interceptor],
      handler: async (task, ctx) => {
        running.add(task.name);
        if (task.name === "quick") {
          await until(() => stopAsked);
          await new Promise((r) => setTimeout(r, 200));
          return { summary: "done in time" };
        }
        ctx.checkpoint("step-3");
        await new Promise<void>((r) => ctx.signal.addEventListener("abort", () => r()));
        slowReason = ctx.signal.reason;
        return { summary: "never sent" };
      },
    });
    await until(() => running.size === 2);
    const workerId = await w.ready;
    const stopping = w.stop();
    stopAsked = true;
    // Drained as soon as the stop begins, while its handlers still run.
    await until(
      async () => (await as(FleetService).getWorker({ workerId })).worker?.drained === true,
    );
    expect(running.size).toBe(2);
    // The stop ends with the grace: by the time it resolves, the slow handler
    // was told its lease is released. The bound only guards against a hang
    // (a stop that waited for the lease to run out, say).
    expect(await within(15_000, stopping)).not.toBe("timed out");
    expect((slowReason as LeaseEndedError).kind).toBe("released");
    const q = (await tasks().getTask({ taskId: quick })).task;
    expect(q?.state).toBe(TaskState.SUCCEEDED);
    const s = (await tasks().getTask({ taskId: slow })).task;
    expect(s?.state).toBe(TaskState.PENDING);
    expect(s?.checkpointHandle).toBe("step-3");
    expect(calls.completed).toEqual([quick]);
    expect(calls.count.get("ReleaseTask")).toBe(1);
    expect(calls.count.get("DeregisterWorker") ?? 0).toBe(0);
    expect((await as(FleetService).getWorker({ workerId })).worker?.drained).toBe(true);
    // The same peer started again is the same worker, still drained: it says so.
    const logs: string[] = [];
    const again = worker({ workloads: [workload], peerId, handler: async () => ({}) }, logs);
    expect(await again.ready).toBe(workerId);
    expect(logs.join("\n")).toContain(`worker ${workerId} is drained`);
    await again.stop();
    // Nothing claims after stop: the released task stays PENDING for someone else.
    await tasks().cancelTask({ taskId: slow });
  }, 30_000);

  it("fails a task whose completion the coordinator refuses in a CompleteTasks batch, and completes the other", async () => {
    const workload = uniqueWorkload("sdk-refused");
    const good = (await tasks().createTask({ workload, name: "good" })).task?.taskId ?? "";
    const bad = (await tasks().createTask({ workload, name: "bad", maxAttempts: 1 })).task?.taskId;
    const calls = recorder();
    const together = barrier(2);
    const logs: string[] = [];
    worker(
      {
        workloads: [workload],
        concurrency: 2,
        interceptors: [calls.interceptor],
        handler: async (task) => {
          await together(); // finish together: one CompleteTasks
          // A result naming an artifact the coordinator does not have: refused.
          return task.name === "bad"
            ? {
                result: { artifactId: "0b0e2a0c-3f5e-4a7b-9d1c-2e3f4a5b6c7d", uri: "", sha256: "" },
              }
            : { summary: "fine" };
        },
      },
      logs,
    );
    const state = async (taskId: string) => (await tasks().getTask({ taskId })).task;
    await until(async () => (await state(good))?.state === TaskState.SUCCEEDED);
    // Failed at once, not left RUNNING until its lease runs out.
    await until(async () => (await state(bad ?? ""))?.state === TaskState.FAILED);
    expect(calls.count.get("CompleteTasks"), logs.join("\n")).toBe(1);
    const failed = await state(bad ?? "");
    expect(failed?.error?.code).toBe("CompletionRefused");
    expect(failed?.attempt).toBe(1);
  }, 30_000);

  it("goes on when CompleteTasks is refused as a whole or one answer is transient: each such completion is sent alone", async () => {
    const workload = uniqueWorkload("sdk-batch-paths");
    const make = async () => {
      const ids = [];
      for (const name of ["a", "b"]) {
        ids.push((await tasks().createTask({ workload, name })).task?.taskId ?? "");
      }
      return ids;
    };
    const run = async (interceptor: Interceptor, ids: string[]) => {
      const calls = recorder();
      const together = barrier(2);
      const logs: string[] = [];
      const w = worker(
        {
          workloads: [workload],
          concurrency: 2,
          interceptors: [calls.interceptor, interceptor],
          handler: async (task) => {
            await together();
            return { summary: `did ${task.name}` };
          },
        },
        logs,
      );
      for (const taskId of ids) {
        await until(async () => {
          const { task } = await tasks().getTask({ taskId });
          return task?.state === TaskState.SUCCEEDED;
        });
      }
      await w.stop();
      return { calls, logs };
    };

    // A coordinator that does not serve CompleteTasks: one by one instead.
    const refuseBatch: Interceptor = (next) => async (req) => {
      if (req.method.name === "CompleteTasks") throw new ConnectError("no", Code.Unimplemented);
      return next(req);
    };
    const first = await run(refuseBatch, await make());
    expect(first.calls.count.get("CompleteTasks"), first.logs.join("\n")).toBe(1);
    expect(first.calls.count.get("CompleteTask")).toBe(2);

    // One answer of the batch says "unavailable": that completion is sent
    // again alone (identical, so the coordinator answers it as done).
    const flaky: Interceptor = (next) => async (req) => {
      const res = await next(req);
      if (req.method.name === "CompleteTasks" && !res.stream) {
        const [one] = (res.message as CompleteTasksResponse).results;
        if (one)
          one.outcome = {
            case: "error",
            value: {
              $typeName: "meshwork.v1.CompletionError",
              code: "unavailable",
              reason: "",
              message: "try again",
            },
          };
      }
      return res;
    };
    const ids = await make();
    const second = await run(flaky, ids);
    expect(second.calls.count.get("CompleteTasks"), second.logs.join("\n")).toBe(1);
    expect(second.calls.count.get("CompleteTask")).toBe(1);
    for (const taskId of ids) {
      expect((await tasks().getTask({ taskId })).task?.attempt).toBe(1);
    }
  }, 30_000);

  it("saves the input to a file with ctx.saveInput: checked, removed on a checksum mismatch, nothing touched for a task without input", async () => {
    const workload = uniqueWorkload("sdk-save-input");
    const dir = mkdtempSync(join(tmpdir(), "meshwork-sdk-save-"));
    const content = "x".repeat(300_000); // several download messages
    const good = (
      await tasks().createTask({
        workload,
        name: "good",
        input: { case: "inputData", value: new TextEncoder().encode(content) },
      })
    ).task?.taskId;
    const bad = (
      await tasks().createTask({
        workload,
        name: "bad",
        maxAttempts: 1,
        input: { case: "inputData", value: new TextEncoder().encode("tampered") },
      })
    ).task?.taskId;
    const none = (await tasks().createTask({ workload, name: "none", maxAttempts: 1 })).task
      ?.taskId;
    // The claim of "bad" names another SHA-256 than its bytes have.
    const tamper: Interceptor = (next) => async (req) => {
      const res = await next(req);
      if (req.method.name === "ClaimTasks" && !res.stream) {
        for (const c of (res.message as ClaimTasksResponse).claims) {
          if (c.name === "bad" && c.input) c.input.sha256 = sha("something else");
        }
      }
      return res;
    };
    const kept = join(dir, "none");
    writeFileSync(kept, "already here");
    const saved = new Map<string, number>();
    worker({
      workloads: [workload],
      concurrency: 3,
      interceptors: [tamper],
      handler: async (task, ctx) => {
        const path = join(dir, task.name);
        saved.set(task.name, await ctx.saveInput(path));
        expect(readFileSync(path, "utf8")).toBe(content);
        return { summary: "saved" };
      },
    });
    const ended = async (taskId = "") => {
      await until(async () => {
        const { task } = await tasks().getTask({ taskId });
        return task?.state === TaskState.SUCCEEDED || task?.state === TaskState.FAILED;
      });
      return (await tasks().getTask({ taskId })).task;
    };
    expect((await ended(good))?.state).toBe(TaskState.SUCCEEDED);
    expect(saved.get("good")).toBe(content.length);
    const refused = await ended(bad);
    expect(refused?.error?.code).toBe("InputChecksumMismatch");
    expect(existsSync(join(dir, "bad"))).toBe(false);
    const empty = await ended(none);
    expect(empty?.error?.code).toBe("NoInput");
    expect(readFileSync(kept, "utf8")).toBe("already here");
  }, 30_000);

  it("gives up on a completion call that hangs after callTimeoutMs and sends it again", async () => {
    const workload = uniqueWorkload("sdk-timeout");
    const taskId = (await tasks().createTask({ workload })).task?.taskId ?? "";
    const calls = recorder();
    let hung = 0;
    // The first CompleteTask never reaches the coordinator: it waits until
    // its deadline aborts it, as a call on a dead connection would.
    const hang: Interceptor = (next) => async (req) => {
      if (req.method.name === "CompleteTask" && hung++ === 0) {
        await new Promise<void>((resolve) => {
          if (req.signal.aborted) resolve();
          req.signal.addEventListener("abort", () => resolve(), { once: true });
        });
      }
      return next(req);
    };
    const logs: string[] = [];
    worker(
      {
        workloads: [workload],
        callTimeoutMs: 500,
        interceptors: [calls.interceptor, hang],
        handler: async () => ({ summary: "after a hung call" }),
      },
      logs,
    );
    await until(async () => {
      const { task } = await tasks().getTask({ taskId });
      return task?.state === TaskState.SUCCEEDED;
    });
    expect(calls.count.get("CompleteTask"), logs.join("\n")).toBe(2);
    expect((await tasks().getTask({ taskId })).task?.resultSummary).toBe("after a hung call");
  }, 30_000);

  it("stops when an operator deregisters it: done rejects saying so, its handler's signal fires, nothing is registered again", async () => {
    const workload = uniqueWorkload("sdk-deregistered");
    const { task: created } = await tasks().createTask({ workload, leaseSeconds: 5 });
    const taskId = created?.taskId ?? "";
    const calls = recorder();
    let reason: unknown;
    const logs: string[] = [];
    const w = worker(
      {
        workloads: [workload],
        concurrency: 2, // a slot free: it keeps claiming while the task runs
        interceptors: [calls.interceptor],
        handler: async (_task, ctx) => {
          await new Promise<void>((r) => ctx.signal.addEventListener("abort", () => r()));
          reason = ctx.signal.reason;
          return { summary: "never sent" };
        },
      },
      logs,
    );
    const workerId = await w.ready;
    await until(async () => (await tasks().getTask({ taskId })).task?.state === TaskState.RUNNING);
    const { releasedTaskIds } = await as(FleetService).deregisterWorker({ workerId });
    expect(releasedTaskIds).toEqual([taskId]);
    await expect(w.done).rejects.toThrow(/no longer registered/);
    expect(reason).toBeInstanceOf(LeaseEndedError);
    expect(calls.count.get("RegisterWorker")).toBe(1);
    expect(calls.count.get("DeregisterWorker") ?? 0).toBe(0);
    expect(calls.completed).toEqual([]);
    // Its task went back to the queue for another worker.
    expect((await tasks().getTask({ taskId })).task?.state).toBe(TaskState.PENDING);
    await tasks().cancelTask({ taskId });
  }, 30_000);

  it("renews with RenewLease when lease streams are off, and progress reaches the task", async () => {
    const workload = uniqueWorkload("sdk-unary");
    const { task: created } = await tasks().createTask({ workload, leaseSeconds: 5, steps: 10 });
    const taskId = created?.taskId ?? "";
    const calls = recorder();
    const w = worker({
      workloads: [workload],
      leaseStreams: false,
      interceptors: [calls.interceptor],
      handler: async (_task, ctx) => {
        ctx.progress(4, "four of ten");
        await new Promise((r) => setTimeout(r, 6000)); // longer than the TTL
        return { summary: "renewed" };
      },
    });
    await until(async () => {
      const { task } = await tasks().getTask({ taskId });
      return task?.progress?.completedSteps === 4;
    });
    const { task: during } = await tasks().getTask({ taskId });
    expect(during?.progress?.message).toBe("four of ten");
    await until(async () => {
      const { task } = await tasks().getTask({ taskId });
      return task?.state === TaskState.SUCCEEDED;
    });
    const { task } = await tasks().getTask({ taskId });
    expect(task?.attempt).toBe(1);
    expect(calls.count.get("RenewLease") ?? 0).toBeGreaterThanOrEqual(2);
    expect(calls.count.get("StreamLeases") ?? 0).toBe(0);
    await w.stop();
  }, 30_000);

  it("stops on SIGTERM in a process of its own: the running task finishes, the worker deregisters, the process exits", async () => {
    const workload = uniqueWorkload("sdk-sigterm");
    const taskId = (await tasks().createTask({ workload })).task?.taskId ?? "";
    // As a user runs it: the built package, imported by its name.
    const script = `
      import { createWorker } from "meshwork/worker";
      const w = createWorker({
        url: process.env.MW_URL, token: process.env.MW_TOKEN, workloads: [process.env.MW_WORKLOAD],
        pollSeconds: 2, graceMs: 600000,
        async handler(task) {
          const signalled = new Promise((r) => process.once("SIGTERM", r));
          console.log("started " + task.id);
          await signalled;
          return { summary: "finished after the signal" };
        },
      });
      console.log("worker " + await w.ready);
      await w.done;
      console.log("done");`;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
      cwd: fileURLToPath(new URL("../..", import.meta.url)),
      env: { ...process.env, MW_URL: url, MW_TOKEN: workerToken, MW_WORKLOAD: workload },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => {
      stdout += d;
    });
    child.stderr.setEncoding("utf8").on("data", (d: string) => {
      stderr += d;
    });
    const exited = new Promise<number | null>((resolve) => child.on("close", resolve));
    const timer = setTimeout(() => child.kill("SIGKILL"), 20_000);
    try {
      await until(() => stdout.includes(`started ${taskId}`));
      child.kill("SIGTERM");
      // The handler returns on the signal; the grace (10 min) is far beyond
      // the SIGKILL above: an exit on its own, with 0, means the finished
      // task and the deregistration ended it, and nothing (not the grace's
      // timer) was left to hold the process.
      expect(await exited, stderr).toBe(0);
    } finally {
      clearTimeout(timer);
    }
    expect(stdout).toContain("done");
    expect(stderr).toContain("SIGTERM: stopping");
    expect(stderr).not.toContain(workerToken);
    const { task } = await tasks().getTask({ taskId });
    expect(task?.state, stderr).toBe(TaskState.SUCCEEDED);
    expect(task?.resultSummary).toBe("finished after the signal");
    const workerId = /worker (\S+)/.exec(stdout)?.[1] ?? "";
    await expect(as(FleetService).getWorker({ workerId })).rejects.toThrow(/not found|not_found/i);
  }, 30_000);

  it("rides out a coordinator restart: the lease stream reconnects, the task completes once, later tasks still come", async () => {
    const workload = uniqueWorkload("sdk-restart");
    // The handler outlives the 5 s TTL: only renewals across the restart keep the lease.
    const first = (await tasks().createTask({ workload, leaseSeconds: 5 })).task?.taskId ?? "";
    const calls = recorder();
    const runs: string[] = [];
    let restarted = false;
    const logs: string[] = [];
    const w = worker(
      {
        workloads: [workload],
        interceptors: [calls.interceptor],
        handler: async (task) => {
          runs.push(task.id);
          if (task.id === first) {
            await until(() => restarted, 20_000);
            await new Promise((r) => setTimeout(r, 4000));
          }
          return { summary: `ok ${task.attempt}` };
        },
      },
      logs,
    );
    await until(() => runs.length === 1);
    await server?.close();
    server = undefined;
    await new Promise((r) => setTimeout(r, 2000)); // down across a renewal round
    await start();
    restarted = true;
    await until(async () => {
      const { task } = await tasks().getTask({ taskId: first });
      return task?.state === TaskState.SUCCEEDED;
    });
    const second = (await tasks().createTask({ workload })).task?.taskId ?? "";
    await until(async () => {
      const { task } = await tasks().getTask({ taskId: second });
      return task?.state === TaskState.SUCCEEDED;
    }, 20_000);
    expect(runs, logs.join("\n")).toEqual([first, second]);
    const { task } = await tasks().getTask({ taskId: first });
    expect(task?.attempt).toBe(1);
    expect(task?.resultSummary).toBe("ok 1");
    expect(calls.completed.filter((id) => id === first)).toHaveLength(1);
    // One stream before the restart, another after it.
    expect(calls.count.get("StreamLeases") ?? 0, logs.join("\n")).toBeGreaterThanOrEqual(2);
    expect(calls.count.get("RegisterWorker")).toBe(1);
    await w.stop();
  }, 45_000);
});
