import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import { createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { transportFor } from "../../src/cli/connect.js";
import { uniqueWorkload } from "../support/harness.js";
import {
  installPythonPackage,
  missingForPythonPackage,
  type PythonPackage,
} from "../support/python.js";
import { adminTasks, useListeningServer } from "../support/server.js";

// The meshwork Python package (clients/python), installed as its README says
// (a venv over Debian's grpcio and protobuf, pip without network), used by a
// script (python-client.py) against a real coordinator with auth on: its
// Worker runs the tasks its Client creates and waits for.

const script = fileURLToPath(new URL("./python-client.py", import.meta.url));
const missing = missingForPythonPackage("python-client");

interface Case {
  case: string;
  [field: string]: unknown;
}

describe.skipIf(missing.length > 0)("the meshwork Python package against a coordinator", () => {
  const server = useListeningServer({ auth: "on" });
  let pkg: PythonPackage | undefined;
  beforeAll(() => {
    pkg = installPythonPackage();
  }, 120_000);
  afterAll(() => pkg?.remove());

  /** Runs python-client.py; killed if it is still running after `limitMs`. */
  function run(args: string[], limitMs = 90_000) {
    return new Promise<{ code: number | null; cases: Map<string, Case>; stderr: string }>(
      (resolve, reject) => {
        const child = spawn(pkg?.python ?? "", [script, ...args], {
          env: { ...process.env, NO_PROXY: "*", no_proxy: "*" },
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
        child.on("error", reject);
        child.on("close", (code) => {
          clearTimeout(timer);
          const cases = new Map<string, Case>();
          for (const line of stdout.split("\n").filter(Boolean)) {
            const parsed = JSON.parse(line) as Case;
            cases.set(parsed.case, parsed);
          }
          resolve({ code, cases, stderr });
        });
      },
    );
  }

  it("creates tasks, runs them with its worker, waits, cancels and reruns", async () => {
    const { secret: clientToken } = await createClient(
      TokenService,
      transportFor({ url: server.url, token: server.adminToken }),
    ).createToken({
      name: `python-client-${randomBytes(4).toString("hex")}`,
      role: TokenRole.CLIENT,
    });
    const workload = uniqueWorkload("pyclient");
    const { code, cases, stderr } = await run([
      server.url,
      clientToken,
      server.workerToken,
      workload,
    ]);
    expect(code, stderr).toBe(0);
    expect(stderr + JSON.stringify([...cases.values()])).not.toContain(clientToken);
    expect(stderr).not.toContain(server.workerToken);
    // The installed copy, not the checkout's.
    expect(String(cases.get("installed")?.file)).toMatch(
      /\/venv\/lib\/python3[^/]*\/site-packages\/meshwork\//,
    );

    const ok = cases.get("ok");
    expect(ok, stderr).toMatchObject({
      state: "SUCCEEDED",
      result: "HELLO",
      metrics: { bytes: 5 },
    });
    expect(ok?.metrics).toHaveProperty("elapsed_seconds");
    const tasks = adminTasks(server);
    const { task } = await tasks.getTask({ taskId: String(ok?.task_id) });
    expect(task?.state).toBe(TaskState.SUCCEEDED);
    expect(task?.result?.contentType).toBe("text/plain");

    expect(cases.get("fail")).toMatchObject({
      raised: true,
      state: "FAILED",
      code: "BadInput",
      message: "the input is not good",
    });
    // Any other exception fails the attempt with its class name as the code.
    expect(cases.get("crash")).toMatchObject({ raised: true, state: "FAILED", code: "ValueError" });
    expect(String(cases.get("crash")?.message)).toContain("the handler broke");

    expect(cases.get("cancel")).toMatchObject({
      raised: true,
      state: "CANCELED",
      returned: "CANCELED",
      handler_stopped: true,
    });
    expect(stderr).toMatch(/lease lost \(LEASE_STATUS_CANCELED/);
    const { task: cancelled } = await tasks.getTask({
      taskId: String(cases.get("cancel")?.task_id),
    });
    expect(cancelled?.state).toBe(TaskState.CANCELED);

    expect(cases.get("timeout")).toMatchObject({ raised: true });
    expect(String(cases.get("timeout")?.message)).toContain("still PENDING");
    expect(cases.get("misc")).toEqual({ case: "misc", same: true, missing: "NOT_FOUND" });
    expect(cases.get("rerun")).toEqual({ case: "rerun", state: "PENDING" });
    // stop() ends the worker's long poll.
    expect(cases.get("stopped")).toEqual({ case: "stopped", alive: false });
    // The handler's dict went with the completion as result_value.
    expect(ok?.value).toEqual({ length: 5, word: "hi" });
  }, 120_000);
});
