import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Interceptor } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { createWorker, TaskError, type Worker, type WorkerOptions } from "../../src/sdk/worker.js";
import { uniqueWorkload } from "../support/harness.js";
import { adminTasks, finishedTask, useListeningServer } from "../support/server.js";

// The worker SDK's side of workflows against a real coordinator with auth
// on: the outputs of a task's dependencies as named inputs (`ctx.inputs`),
// the handler's result value (`value` → result_value), alone and batched in
// CompleteTasks, and the attempt's time bound (`ctx.timeoutSeconds`).

const sha = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");

describe("the worker SDK in a workflow", () => {
  const server = useListeningServer({
    auth: "on",
    blobDir: mkdtempSync(join(tmpdir(), "meshwork-sdk-wf-blobs-")),
  });
  const tasks = () => adminTasks(server);
  const workers: Worker[] = [];
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop().catch(() => {})));
  });

  function worker(
    options: Pick<WorkerOptions, "workloads" | "handler"> & Partial<WorkerOptions>,
    logs: string[] = [],
  ): Worker {
    const w = createWorker({
      url: server.url,
      token: server.workerToken,
      pollSeconds: 2,
      installSignalHandlers: false,
      log: (m) => logs.push(m),
      ...options,
    });
    workers.push(w);
    return w;
  }

  it("gives a task its dependency's outputs by name and keeps each handler's value as result_value", async () => {
    const workload = uniqueWorkload("sdk-wf-graph");
    const { tasks: created } = await tasks().createTasks({
      tasks: [
        { workload, ref: "prep", parameters: { step: "prep" } },
        { workload, dependsOn: ["ref:prep"], parameters: { step: "use" }, timeoutSeconds: 120 },
      ],
    });
    const [prepId, useId] = created.map((t) => t.taskId) as [string, string];
    const seen: { names?: string[]; timeout?: number; byTask?: Record<string, string> } = {};
    const saved = join(mkdtempSync(join(tmpdir(), "meshwork-sdk-wf-")), "result.txt");
    const logs: string[] = [];
    const w = worker(
      {
        workloads: [workload],
        handler: async (task, ctx) => {
          if (task.parameters.step === "prep") {
            const result = await ctx.upload("data.txt", "a,b,c\n", { contentType: "text/csv" });
            await ctx.upload("extra.bin", new Uint8Array([1, 2, 3]));
            return { result, value: { rows: 1, tags: ["x", "y"], nested: { ok: true } } };
          }
          seen.names = Object.keys(ctx.inputs).sort();
          seen.timeout = ctx.timeoutSeconds;
          seen.byTask = task.dependencyOutputs;
          const data = new TextDecoder().decode(await ctx.inputs["prep/data.txt"]?.bytes());
          const size = await ctx.inputs["prep/result"]?.save(saved);
          let streamed = 0;
          for await (const chunk of ctx.inputs["prep/extra.bin"]?.stream() ?? []) {
            streamed += chunk.byteLength;
          }
          return { value: { data, size: size ?? -1, streamed } };
        },
      },
      logs,
    );
    await w.ready;
    const prep = await finishedTask(server, prepId);
    const use = await finishedTask(server, useId);
    expect(prep?.state, logs.join("\n")).toBe(TaskState.SUCCEEDED);
    expect(use?.state, `${use?.error?.code} ${use?.error?.message}\n${logs.join("\n")}`).toBe(
      TaskState.SUCCEEDED,
    );
    expect(seen.names).toEqual(["prep/data.txt", "prep/extra.bin", "prep/result"]);
    expect(seen.timeout).toBe(120);
    expect(seen.byTask?.["prep/result"]).toBe(prep?.result?.artifactId);
    expect(readFileSync(saved, "utf8")).toBe("a,b,c\n");
    expect(sha(readFileSync(saved))).toBe(prep?.result?.sha256);
    expect(prep?.resultValue).toEqual({ rows: 1, tags: ["x", "y"], nested: { ok: true } });
    expect(use?.resultValue).toEqual({ data: "a,b,c\n", size: 6, streamed: 3 });
    await w.stop();
  });

  it("refuses a named input whose bytes do not hash to its artifact's SHA-256, leaving no file", async () => {
    const workload = uniqueWorkload("sdk-wf-corrupt");
    const { tasks: created } = await tasks().createTasks({
      tasks: [
        { workload, ref: "prep", parameters: { step: "prep" } },
        { workload, dependsOn: ["ref:prep"] },
      ],
    });
    // Flips the first byte of every downloaded chunk, as a bad network path might.
    const corrupt: Interceptor = (next) => async (req) => {
      const res = await next(req);
      if (req.method.name !== "DownloadArtifact" || !res.stream) return res;
      const messages = res.message as AsyncIterable<{ chunk: Uint8Array }>;
      async function* flipped() {
        for await (const m of messages) {
          const chunk = new Uint8Array(m.chunk);
          if (chunk.length > 0) chunk[0] = (chunk[0] ?? 0) ^ 0xff;
          yield { ...m, chunk };
        }
      }
      return { ...res, message: flipped() as typeof res.message };
    };
    const path = join(mkdtempSync(join(tmpdir(), "meshwork-sdk-wf-")), "out.txt");
    const codeOf = (e: unknown) => (e instanceof TaskError ? e.code : String(e));
    const w = worker({
      workloads: [workload],
      interceptors: [corrupt],
      handler: async (task, ctx) => {
        if (task.parameters.step === "prep") {
          await ctx.upload("out.txt", "good bytes");
          return {};
        }
        const input = ctx.inputs["prep/out.txt"];
        const bytes = await input?.bytes().then(() => "ok", codeOf);
        const saved = await input?.save(path).then(() => "ok", codeOf);
        return { value: { bytes, saved, left: existsSync(path) } };
      },
    });
    const use = await finishedTask(server, created[1]?.taskId ?? "");
    expect(use?.resultValue).toEqual({
      bytes: "InputChecksumMismatch",
      saved: "InputChecksumMismatch",
      left: false,
    });
    await w.stop();
  });

  it("sends the values of tasks that finish together in one CompleteTasks", async () => {
    const workload = uniqueWorkload("sdk-wf-batch");
    const { tasks: created } = await tasks().createTasks({
      tasks: [1, 2, 3].map((n) => ({ workload, parameters: { n } })),
    });
    let calls = 0;
    const counter: Interceptor = (next) => (req) => {
      if (req.method.name === "CompleteTasks") calls++;
      return next(req);
    };
    let arrived = 0;
    let release = () => {};
    const all = new Promise<void>((r) => {
      release = r;
    });
    const w = worker({
      workloads: [workload],
      concurrency: 3,
      completionBatchMs: 1000, // a wide window: about batching, not the machine's speed
      interceptors: [counter],
      handler: async (task) => {
        if (++arrived === 3) release();
        await all;
        return { value: { twice: Number(task.parameters.n) * 2, id: task.id } };
      },
    });
    for (const t of created) {
      const task = await finishedTask(server, t.taskId);
      expect(task?.state).toBe(TaskState.SUCCEEDED);
      expect(task?.resultValue).toEqual({
        twice: Number(task?.parameters?.n) * 2,
        id: t.taskId,
      });
    }
    expect(calls).toBe(1);
    await w.stop();
  });

  it("fails, without retrying, a task whose value is not a JSON object or is over 64 KiB", async () => {
    const workload = uniqueWorkload("sdk-wf-bad");
    const { tasks: created } = await tasks().createTasks({
      tasks: ["array", "big", "bigint"].map((kind) => ({
        workload,
        parameters: { kind },
        maxAttempts: 3,
      })),
    });
    const w = worker({
      workloads: [workload],
      concurrency: 3,
      handler: (task) => {
        const kind = task.parameters.kind;
        if (kind === "array") return { value: [1, 2] };
        if (kind === "bigint") return { value: { n: 1n } };
        return { value: { text: "x".repeat(70 * 1024) } };
      },
    });
    const codes = [];
    for (const t of created) {
      const task = await finishedTask(server, t.taskId);
      expect(task?.state).toBe(TaskState.FAILED);
      expect(task?.attempt).toBe(1);
      codes.push(task?.error?.code);
    }
    expect(codes).toEqual(["ResultValueInvalid", "ResultValueTooLarge", "ResultValueInvalid"]);
    await w.stop();
  });
});
