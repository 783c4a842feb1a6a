import { spawn, spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import type { DescService } from "@bufbuild/protobuf";
import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { uniqueWorkload } from "../support/harness.js";
import { useListeningServer } from "../support/server.js";

// The example worker in examples/python-worker, run as a user would run it,
// against a real coordinator with auth on, over the REST worker API.

const worker = fileURLToPath(new URL("../../examples/python-worker/worker.py", import.meta.url));
const hasPython = spawnSync("python3", ["--version"]).status === 0;
const sha = (s: string) => createHash("sha256").update(s).digest("hex");
/** A deterministic command: the input upper-cased, then the `suffix` parameter. */
const upper = [
  "python3",
  "-c",
  "import json, os, sys; p = json.loads(os.environ['MESHWORK_PARAMETERS']); " +
    "sys.stdout.write(sys.stdin.read().upper() + p['suffix'])",
];

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

describe.skipIf(!hasPython)("examples/python-worker against a coordinator with auth on", () => {
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
      name: `python-worker-${randomBytes(4).toString("hex")}`,
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
    const args = [worker, "--url", server.url, "--capability", workload, "--max-tasks", "1"];
    args.push("--poll", "0.2", "--idle-exit", "15", "--content-type", "text/plain");
    return new Promise((resolve, reject) => {
      const child = spawn("python3", [...args, "--", ...command], {
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

  it("claims a task, runs the command on its input and completes it with the output", async () => {
    const token = await workerToken();
    const workload = uniqueWorkload("py");
    const input = "hello, meshwork\n";
    const expected = "HELLO, MESHWORK\n!";
    const { task: created } = await tasks().createTask({
      workload,
      input: { case: "inputData", value: new TextEncoder().encode(input) },
      parameters: { suffix: "!" },
    });
    const taskId = created?.taskId ?? "";

    const run = await runWorker(workload, upper, token);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr + run.stdout).not.toContain(token);

    const { task } = await tasks().getTask({ taskId });
    expect(task?.state, run.stderr).toBe(TaskState.SUCCEEDED);
    expect(task?.result?.sha256).toBe(sha(expected));
    expect(task?.result?.contentType).toBe("text/plain");
    expect(task?.metrics).toHaveProperty("elapsed_seconds");
    const result = await fetch(`${server.url}/tasks/${taskId}/result`, {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(result.status).toBe(200);
    expect(await result.text()).toBe(expected);
  }, 60_000);

  it("reports a command that exits non-zero as CommandFailed, with its exit status and stderr", async () => {
    const token = await workerToken();
    const workload = uniqueWorkload("py-fail");
    const { task: created } = await tasks().createTask({
      workload,
      input: { case: "inputData", value: new TextEncoder().encode("x") },
      maxAttempts: 1, // no retry: the failure makes the task FAILED
    });
    const taskId = created?.taskId ?? "";
    const failing = [
      "python3",
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

  it("exits non-zero with a clear message, never printing it, when the token is wrong or missing", async () => {
    const workload = uniqueWorkload("py-auth");
    const wrong = `mw_${randomBytes(32).toString("base64url")}`; // well-formed, unknown
    const refused = await runWorker(workload, upper, wrong);
    expect(refused.signal, refused.stderr).toBeNull(); // it exited on its own
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toMatch(/refused the token \(401/);
    expect(refused.stderr + refused.stdout).not.toContain(wrong);
    expect(refused.stderr).not.toMatch(/mw_[A-Za-z0-9_-]{43}/);

    const missing = await runWorker(workload, upper, undefined);
    expect(missing.signal, missing.stderr).toBeNull();
    expect(missing.code).not.toBe(0);
    expect(missing.stderr).toContain("no token");
    expect(missing.stderr).toMatch(/refused the token \(401/);
  }, 60_000);
});
