import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { DescService } from "@bufbuild/protobuf";
import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { uniqueWorkload } from "../support/harness.js";
import { missingForPythonGrpc, python } from "../support/python.js";
import { useListeningServer } from "../support/server.js";

// The gRPC example worker in examples/python-grpc-worker, run as a user would
// run it (from the checkout, on the meshwork package in clients/python with
// its committed stubs, Debian's /usr/bin/python3 with python3-grpcio),
// against a real coordinator with auth on, over h2c.

const dir = fileURLToPath(new URL("../../examples/python-grpc-worker/", import.meta.url));
const missing = missingForPythonGrpc("python-grpc-worker");
const sha = (s: string) => createHash("sha256").update(s).digest("hex");
/** A deterministic command: the input upper-cased, then the `suffix` parameter. */
const upper = (sleepSeconds = 0) => [
  python,
  "-c",
  `import json, os, sys, time; time.sleep(${sleepSeconds}); ` +
    "p = json.loads(os.environ['MESHWORK_PARAMETERS']); " +
    "sys.stdout.write(sys.stdin.read().upper() + p['suffix'])",
];

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

describe.skipIf(missing.length > 0)(
  "examples/python-grpc-worker against a coordinator with auth on",
  () => {
    const server = useListeningServer({ auth: "on" });

    function as<S extends DescService>(service: S, token: string): Client<S> {
      return createClient(
        service,
        createConnectTransport({
          baseUrl: server.url,
          httpVersion: "1.1",
          interceptors: [
            (next) => (req) => {
              req.header.set("authorization", `Bearer ${token}`);
              return next(req);
            },
          ],
        }),
      );
    }
    const tasks = () => as(TaskService, server.adminToken);

    async function workerToken(): Promise<string> {
      const { secret } = await as(TokenService, server.adminToken).createToken({
        name: `python-grpc-worker-${randomBytes(4).toString("hex")}`,
        role: TokenRole.WORKER,
      });
      return secret;
    }

    /** Runs the worker for one task; killed if it is still running after `limitMs`. */
    function runWorker(
      workload: string,
      command: string[],
      token: string | undefined,
      limitMs = 40_000,
    ): Promise<Run> {
      const env: NodeJS.ProcessEnv = { ...process.env, NO_PROXY: "*", no_proxy: "*" };
      if (token === undefined) delete env.MESHWORK_TOKEN;
      else env.MESHWORK_TOKEN = token;
      const url = new URL(server.url).host; // HOST:PORT, plaintext h2c
      const args = [join(dir, "worker.py"), "--url", url, "--capability", workload];
      args.push("--max-tasks", "1", "--wait", "2", "--idle-exit", "15");
      args.push("--content-type", "text/plain");
      return new Promise((resolve, reject) => {
        const child = spawn(python, [...args, "--", ...command], {
          env,
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
        const timer = setTimeout(() => child.kill("SIGKILL"), limitMs);
        child.on("error", (error) => {
          clearTimeout(timer);
          reject(error);
        });
        child.on("close", (code, signal) => {
          clearTimeout(timer);
          resolve({ code, signal, stdout, stderr });
        });
      });
    }

    it("claims a task, keeps its lease over StreamLeases, uploads the output and completes with it", async () => {
      const token = await workerToken();
      const workload = uniqueWorkload("pygrpc");
      const input = "hello, meshwork\n";
      const expected = "HELLO, MESHWORK\n!";
      const { task: created } = await tasks().createTask({
        workload,
        input: { case: "inputData", value: new TextEncoder().encode(input) },
        parameters: { suffix: "!" },
        // The command outlives one TTL: only renewals keep the lease until the completion.
        leaseSeconds: 5,
      });
      const taskId = created?.taskId ?? "";

      const run = await runWorker(workload, upper(6), token);
      expect(run.code, run.stderr).toBe(0);
      expect(run.stderr + run.stdout).not.toContain(token);
      expect(run.stderr).toContain(`task ${taskId} succeeded`);

      const { task } = await tasks().getTask({ taskId });
      expect(task?.state, run.stderr).toBe(TaskState.SUCCEEDED);
      expect(task?.result?.sha256).toBe(sha(expected));
      expect(task?.result?.sizeBytes).toBe(BigInt(Buffer.byteLength(expected)));
      expect(task?.result?.contentType).toBe("text/plain");
      expect(task?.metrics).toHaveProperty("elapsed_seconds");
      expect(task?.metrics?.elapsed_seconds).toBeGreaterThan(5);
      const result = await fetch(`${server.url}/tasks/${taskId}/result`, {
        headers: { authorization: `Bearer ${token}` },
      });
      expect(result.status).toBe(200);
      expect(await result.text()).toBe(expected);
    }, 60_000);

    it("reports a command that exits non-zero with FailTask, with its exit status and stderr", async () => {
      const token = await workerToken();
      const workload = uniqueWorkload("pygrpc-fail");
      const { task: created } = await tasks().createTask({
        workload,
        input: { case: "inputData", value: new TextEncoder().encode("x") },
        maxAttempts: 1, // no retry: the failure makes the task FAILED
      });
      const taskId = created?.taskId ?? "";
      const failing = [
        python,
        "-c",
        "import sys; sys.stderr.write('warming up\\nsomething broke\\n'); sys.exit(3)",
      ];

      const run = await runWorker(workload, failing, token);
      expect(run.code, run.stderr).toBe(0); // the worker did its job: it reported the failure

      const { task } = await tasks().getTask({ taskId });
      expect(task?.state, run.stderr).toBe(TaskState.FAILED);
      expect(task?.error?.code).toBe("CommandFailed");
      expect(task?.error?.message).toContain("exit status 3");
      expect(task?.error?.message).toContain("something broke");
      expect(task?.result).toBeUndefined();
    }, 60_000);

    it("stops the command when the stream says the lease is gone (the task was cancelled)", async () => {
      const token = await workerToken();
      const workload = uniqueWorkload("pygrpc-cancel");
      const { task: created } = await tasks().createTask({ workload, leaseSeconds: 6 });
      const taskId = created?.taskId ?? "";
      // A command that never ends on its own (an hour, far beyond the
      // worker's 40 s SIGKILL): the worker's exit with 0 means it stopped the
      // command. It writes its pid, so the test sees the process is gone.
      const pidFile = join(mkdtempSync(join(tmpdir(), "meshwork-pycmd-")), "pid");
      const endless = [
        python,
        "-c",
        "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(3600)",
        pidFile,
      ];

      const running = runWorker(workload, endless, token);
      // Cancel once the worker holds the lease.
      for (let i = 0; i < 100; i++) {
        const { task } = await tasks().getTask({ taskId });
        if (task?.state !== TaskState.PENDING) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      await tasks().cancelTask({ taskId });
      const run = await running;
      const pid = Number(readFileSync(pidFile, "utf8"));
      const alive = () => {
        try {
          process.kill(pid, 0);
          return true;
        } catch {
          return false;
        }
      };
      try {
        expect(run.code, run.stderr).toBe(0);
        expect(run.stderr).toMatch(/lease lost \(LEASE_STATUS_CANCELED/);
        expect(run.stderr).toContain("terminating the command");
        // The worker waited for the command it stopped: gone, not left behind.
        expect(alive()).toBe(false);
      } finally {
        if (alive()) process.kill(pid, "SIGKILL");
      }
      const { task } = await tasks().getTask({ taskId });
      expect(task?.state).toBe(TaskState.CANCELED);
    }, 60_000);

    it("exits non-zero with a clear message, never printing it, when the token is wrong or missing", async () => {
      const workload = uniqueWorkload("pygrpc-auth");
      const wrong = `mw_${randomBytes(32).toString("base64url")}`; // well-formed, unknown
      const refused = await runWorker(workload, upper(), wrong);
      expect(refused.signal, refused.stderr).toBeNull(); // it exited on its own
      expect(refused.code).toBe(1);
      expect(refused.stderr).toMatch(/refused the token \(UNAUTHENTICATED/);
      // The reason comes from the ErrorInfo in grpc-status-details-bin.
      expect(refused.stderr).toContain("; reason UNAUTHENTICATED)");
      expect(refused.stderr + refused.stdout).not.toContain(wrong);
      expect(refused.stderr).not.toMatch(/mw_[A-Za-z0-9_-]{43}/);

      const absent = await runWorker(workload, upper(), undefined);
      expect(absent.signal, absent.stderr).toBeNull();
      expect(absent.code).toBe(1);
      expect(absent.stderr).toContain("no token");
      expect(absent.stderr).toMatch(/refused the token \(UNAUTHENTICATED/);
    }, 60_000);
  },
);
