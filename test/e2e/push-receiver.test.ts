import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { DeliveryState, type Task, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { transportFor } from "../../src/cli/connect.js";
import { createPushWorker, type PushWorker, signDispatch } from "../../src/sdk/worker.js";
import { until } from "../support/bounded.js";
import { uniqueWorkload } from "../support/harness.js";
import {
  adminTasks,
  bytesAt,
  finishedTask,
  type ListeningServer,
  useListeningServer,
} from "../support/server.js";

// The reference receivers of pushed work (SPEC §14) against a real
// coordinator with auth on: the SDK's createPushWorker, `meshwork work
// --listen` and examples/python-worker --listen. Each is placed a task with
// ScheduleTask and sent its dispatch as the coordinator does, POST
// {api_base_url}/meshwork/tasks with X-Meshwork-Signature: a forged, stale
// or unsigned one is refused with 401 and nothing runs; a signed one runs
// to SUCCEEDED, and its repeat is answered 409. Then the same through the
// coordinator's own dispatcher (a task created with dispatch: true).

const pythonWorker = fileURLToPath(
  new URL("../../examples/python-worker/worker.py", import.meta.url),
);
const hasPython = spawnSync("python3", ["--version"]).status === 0;
const now = () => Math.floor(Date.now() / 1000);

/** FleetService on the server, called as its admin. */
function adminFleet(server: ListeningServer) {
  return createClient(FleetService, transportFor({ url: server.url, token: server.adminToken }));
}

/** A receiver under test: where it takes dispatches and the secret it registered. */
interface Receiver {
  dispatchUrl: string;
  secret: string;
  workload: string;
  log: () => string;
}

describe("push receivers", () => {
  const server = useListeningServer({ auth: "on" });
  const tasks = () => adminTasks(server);

  /** A task of `workload` placed with ScheduleTask: ASSIGNED, with its lease token. */
  async function placed(workload: string, parameters: Record<string, string>): Promise<Task> {
    const { task } = await tasks().createTask({ workload, parameters, maxAttempts: 1 });
    const { task: assigned } = await tasks().scheduleTask({ taskId: task?.taskId ?? "" });
    expect(assigned?.state).toBe(TaskState.ASSIGNED);
    return assigned as Task;
  }

  /** The body the coordinator sends for `task` (SPEC §14), as exact text. */
  function bodyOf(task: Task): string {
    return JSON.stringify({
      taskId: task.taskId,
      attempt: task.attempt,
      leaseToken: task.lease?.leaseToken,
      leaseExpiresAt: task.lease?.expiresAt
        ? timestampDate(task.lease.expiresAt).toISOString()
        : "",
      workload: task.workload,
      parameters: task.parameters ?? {},
      input: task.input ? { uri: task.input.uri, sha256: task.input.sha256 } : null,
      correlationId: task.correlationId,
      traceparent: task.traceparent,
      coordinatorUrl: server.url,
    });
  }

  function post(url: string, body: string, signature?: string): Promise<Response> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (signature !== undefined) headers["x-meshwork-signature"] = signature;
    return fetch(url, { method: "POST", headers, body });
  }

  /** The same checks for every receiver. */
  function receiverContract(
    receiver: () => Receiver,
    ran: () => number,
    checkResult: (text: string) => void,
  ) {
    it("refuses an unsigned, forged, tampered or stale dispatch with 401, and runs nothing", async () => {
      const r = receiver();
      const task = await placed(r.workload, { who: "nobody" });
      const body = bodyOf(task);
      const wrong = randomBytes(32).toString("hex");
      try {
        const refused = [
          await post(r.dispatchUrl, body),
          await post(r.dispatchUrl, body, "t=1,v1=00"),
          await post(r.dispatchUrl, body, signDispatch(wrong, body)),
          await post(
            r.dispatchUrl,
            body.replace("nobody", "someone"),
            signDispatch(r.secret, body),
          ),
          await post(r.dispatchUrl, body, signDispatch(r.secret, body, now() - 400)),
          await post(r.dispatchUrl, body, signDispatch(r.secret, body, now() + 400)),
        ];
        expect(refused.map((res) => res.status)).toEqual([401, 401, 401, 401, 401, 401]);
        const { task: after } = await tasks().getTask({ taskId: task.taskId });
        expect(after?.state, r.log()).toBe(TaskState.ASSIGNED);
        expect(ran()).toBe(0);
        // Not the dispatch path; a body over the cap.
        const elsewhere = await post(r.dispatchUrl.replace(/\/meshwork\/tasks$/, "/other"), body);
        expect(elsewhere.status).toBe(404);
        const huge = "x".repeat(9 << 20);
        const tooLarge = await post(r.dispatchUrl, huge, signDispatch(r.secret, huge));
        expect(tooLarge.status).toBe(413);
      } finally {
        await tasks().cancelTask({ taskId: task.taskId }); // its slot freed for the next test
      }
    });

    it("runs a signed dispatch to SUCCEEDED (StartTask, renewals, upload, completion); a repeat is 409", async () => {
      const r = receiver();
      const task = await placed(r.workload, { who: "world" });
      const body = bodyOf(task);
      const res = await post(r.dispatchUrl, body, signDispatch(r.secret, body));
      expect(res.status, r.log()).toBe(202);
      const again = await post(r.dispatchUrl, body, signDispatch(r.secret, body));
      expect(again.status).toBe(409);
      const done = await finishedTask(server, task.taskId, 30_000);
      expect(done?.state, r.log()).toBe(TaskState.SUCCEEDED);
      expect(done?.attempt).toBe(1);
      checkResult(await bytesAt(server, done?.result?.uri ?? ""));
    });

    it("runs a task the coordinator itself delivers (dispatch: true) to SUCCEEDED, once", async () => {
      const r = receiver();
      const { task } = await tasks().createTask({
        workload: r.workload,
        parameters: { who: "world" },
        maxAttempts: 1,
        dispatch: true,
      });
      const taskId = task?.taskId ?? "";
      await tasks().scheduleTask({ taskId });
      const done = await finishedTask(server, taskId, 30_000);
      expect(done?.state, r.log()).toBe(TaskState.SUCCEEDED);
      expect(done?.attempt).toBe(1);
      expect(done?.delivery).toMatchObject({
        state: DeliveryState.ACCEPTED,
        attempt: 1,
        tries: 1,
        lastStatus: 202,
      });
      checkResult(await bytesAt(server, done?.result?.uri ?? ""));
    });
  }

  describe("createPushWorker (the SDK)", () => {
    const workload = uniqueWorkload("push-sdk");
    const secret = randomBytes(32).toString("hex");
    let worker: PushWorker | undefined;
    let runs = 0;
    let lines = "";
    beforeAll(async () => {
      worker = createPushWorker({
        url: server.url,
        token: server.workerToken,
        workloads: [workload],
        listen: "127.0.0.1:0",
        dispatchSecret: secret,
        maxBodyBytes: 1 << 20,
        installSignalHandlers: false,
        log: (m) => {
          lines += `${m}\n`;
        },
        async handler(task, ctx) {
          runs++;
          const result = await ctx.upload("out.txt", `hello ${String(task.parameters.who)}`);
          return { result, value: { who: task.parameters.who ?? null } };
        },
      });
      await worker.ready;
    });
    afterAll(async () => {
      await worker?.stop();
    });

    receiverContract(
      () => ({
        dispatchUrl: `${worker?.listenUrl}/meshwork/tasks`,
        secret,
        workload,
        log: () => lines,
      }),
      () => runs,
      (text) => expect(text).toBe("hello world"),
    );

    it("registered the address it bound as its api_base_url", async () => {
      const { worker: registered } = await adminFleet(server).getWorker({
        workerId: await (worker as PushWorker).ready,
      });
      expect(registered?.apiBaseUrl).toBe(worker?.listenUrl);
      expect(registered?.dispatchPath).toBe("/meshwork/tasks");
      expect(registered?.hasDispatchSecret).toBe(true);
    });

    it("renews at once, and stops like a pull worker: refuses new dispatches (410), lets the running task finish, deregisters", async () => {
      const workload2 = uniqueWorkload("push-stop");
      let release = () => {};
      const released = new Promise<void>((resolve) => {
        release = resolve;
      });
      let started = () => {};
      const running = new Promise<void>((resolve) => {
        started = resolve;
      });
      const stopping = createPushWorker({
        url: server.url,
        token: server.workerToken,
        workloads: [workload2],
        listen: "127.0.0.1:0",
        dispatchSecret: secret,
        concurrency: 2,
        installSignalHandlers: false,
        log: (m) => {
          lines += `${m}\n`;
        },
        async handler() {
          started();
          await released;
          return { summary: "finished after stop" };
        },
      });
      const workerId = await stopping.ready;
      const url = `${stopping.listenUrl}/meshwork/tasks`;
      const first = await placed(workload2, {});
      const second = await placed(workload2, {});
      const b1 = bodyOf(first);
      expect((await post(url, b1, signDispatch(secret, b1))).status).toBe(202);
      await running;
      // Its lease is renewed at once (granted at placement, it is not all left).
      const leaseEnd = (t: Task | undefined) => {
        const at = t?.lease?.expiresAt;
        return at ? timestampDate(at).getTime() : 0;
      };
      await until(async () => {
        const { task } = await tasks().getTask({ taskId: first.taskId });
        return leaseEnd(task) > leaseEnd(first);
      });
      const stopped = stopping.stop();
      const b2 = bodyOf(second);
      expect((await post(url, b2, signDispatch(secret, b2))).status, lines).toBe(410);
      release();
      await stopped;
      const done = await finishedTask(server, first.taskId);
      expect(done?.state, lines).toBe(TaskState.SUCCEEDED);
      expect(done?.resultSummary).toBe("finished after stop");
      await expect(adminFleet(server).getWorker({ workerId })).rejects.toThrow(/not.found/i);
      await tasks().cancelTask({ taskId: second.taskId });
    });
  });

  describe("meshwork work --listen", () => {
    const workload = uniqueWorkload("push-cli");
    const secret = randomBytes(32).toString("hex");
    let child: ChildProcess | undefined;
    let stdout = "";
    let stderr = "";
    let dispatchUrl = "";
    beforeAll(async () => {
      child = spawn(
        "node",
        [
          "bin/meshwork.js",
          "work",
          "--url",
          server.url,
          "--workload",
          workload,
          "--listen",
          "127.0.0.1:0",
          "--",
          "sh",
          "-c",
          // The parameters, then how many of the worker's secrets the command sees (none).
          'out="$MESHWORK_OUTPUT/out.txt"; cat > "$out"; ' +
            '(env | grep -c -e MESHWORK_DISPATCH_SECRET -e MESHWORK_TOKEN || true) >> "$out"',
        ],
        {
          env: {
            PATH: process.env.PATH ?? "",
            HOME: process.env.HOME ?? "",
            MESHWORK_TOKEN: server.workerToken,
            MESHWORK_DISPATCH_SECRET: secret,
          },
          stdio: ["ignore", "pipe", "pipe"],
        },
      );
      child.stdout?.on("data", (d) => {
        stdout += String(d);
      });
      child.stderr?.on("data", (d) => {
        stderr += String(d);
      });
      await until(() => stderr.includes("registered as worker"), 20_000);
      dispatchUrl = /taking dispatches at (\S+)/.exec(stderr)?.[1] ?? "";
    });
    afterAll(async () => {
      const c = child;
      if (c?.exitCode !== null) return;
      const exited = new Promise((resolve) => c.once("exit", resolve));
      c.kill("SIGTERM");
      await exited;
    });

    receiverContract(
      () => ({ dispatchUrl, secret, workload, log: () => stderr }),
      () => (stdout.match(/ start /g) ?? []).length,
      (text) => {
        expect(text).toBe('{"who":"world"}0\n');
        expect(stderr + stdout).not.toContain(secret);
      },
    );
  });

  describe.skipIf(!hasPython)("examples/python-worker --listen", () => {
    const workload = uniqueWorkload("push-py");
    const secret = randomBytes(32).toString("hex");
    let child: ChildProcess | undefined;
    let stderr = "";
    let dispatchUrl = "";
    beforeAll(async () => {
      child = spawn(
        "python3",
        [
          pythonWorker,
          "--url",
          server.url,
          "--capability",
          workload,
          "--listen",
          "127.0.0.1:0",
          "--content-type",
          "text/plain",
          "--",
          "python3",
          "-c",
          "import os, sys; sys.stdout.write(os.environ['MESHWORK_PARAMETERS'] + " +
            "str('MESHWORK_DISPATCH_SECRET' in os.environ))",
        ],
        {
          env: {
            ...process.env,
            NO_PROXY: "*",
            no_proxy: "*",
            MESHWORK_TOKEN: server.workerToken,
            MESHWORK_DISPATCH_SECRET: secret,
          },
          stdio: ["ignore", "pipe", "pipe"],
        },
      );
      child.stderr?.on("data", (d) => {
        stderr += String(d);
      });
      await until(() => stderr.includes("registered as"), 20_000);
      dispatchUrl = /taking dispatches at (\S+)/.exec(stderr)?.[1] ?? "";
    });
    afterAll(async () => {
      const c = child;
      if (c?.exitCode !== null) return;
      const exited = new Promise((resolve) => c.once("exit", resolve));
      c.kill("SIGTERM");
      await exited;
    });

    receiverContract(
      () => ({ dispatchUrl, secret, workload, log: () => stderr }),
      () => (stderr.match(/dispatched task/g) ?? []).length,
      (text) => {
        expect(text).toBe('{"who": "world"}False');
        expect(stderr).not.toContain(secret);
      },
    );
  });
});
