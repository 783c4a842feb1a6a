import { type ChildProcess, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { until, within } from "../support/bounded.js";
import { missingForPythonGrpc } from "../support/python.js";
import { adminTasks, bytesAt, finishedTask, useListeningServer } from "../support/server.js";

// The README's worker examples, run as written against a coordinator with
// auth on: the TypeScript SDK example, `meshwork work` and the Python gRPC
// worker. Only the coordinator's URL and the token placeholder are substituted.

const readme = readFileSync(new URL("../../README.md", import.meta.url), "utf8");
const root = fileURLToPath(new URL("../../", import.meta.url));
const README_URL = "http://127.0.0.1:8080";

/** The fenced `lang` block between the two markers. */
function block(name: string, lang: string): string {
  const m = new RegExp(
    `<!-- ${name}:start -->\\s*\`\`\`${lang}\\n([\\s\\S]*?)\`\`\`\\s*<!-- ${name}:end -->`,
  ).exec(readme);
  if (!m?.[1]) throw new Error(`README has no ${name} block`);
  return m[1];
}

/**
 * The process a `bash -c` script runs as its last command: bash execs the
 * last command of a -c script itself; when it has not, that command is its
 * only child. SIGTERM goes to it, not to bash, which would not pass it on.
 */
function lastCommandPid(shellPid: number): number {
  expect(shellPid).toBeGreaterThan(0);
  if (readFileSync(`/proc/${shellPid}/comm`, "utf8").trim() !== "bash") return shellPid;
  const kids = readFileSync(`/proc/${shellPid}/task/${shellPid}/children`, "utf8")
    .trim()
    .split(/\s+/);
  expect(kids).toHaveLength(1);
  const pid = Number(kids[0]);
  expect(pid).toBeGreaterThan(0);
  return pid;
}

/** A child process with its output collected and its exit code awaited. */
function start(command: string, args: string[], env: NodeJS.ProcessEnv, cwd: string) {
  const child = spawn(command, args, { env, cwd, stdio: ["ignore", "pipe", "pipe"] });
  const out = { stdout: "", stderr: "" };
  child.stdout.on("data", (d) => {
    out.stdout += String(d);
  });
  child.stderr.on("data", (d) => {
    out.stderr += String(d);
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (c) => resolve(c)));
  return { child, out, exited };
}

describe("README worker examples", () => {
  const server = useListeningServer({
    auth: "on",
    blobDir: mkdtempSync(join(tmpdir(), "meshwork-readme-blobs-")),
  });
  const children: ChildProcess[] = [];
  const tasks = () => adminTasks(server);
  const finished = (taskId: string) => finishedTask(server, taskId);
  const bytesOf = (uri: string) => bytesAt(server, uri);
  const wc = (text: string) =>
    tasks().createTask({
      workload: "wc",
      input: { case: "inputData", value: new TextEncoder().encode(text) },
      maxAttempts: 1,
    });

  afterAll(() => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  });

  it("runs the TypeScript SDK example as written: counts lines, fails empty input, exits 0 on SIGTERM", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-readme-sdk-"));
    const sdk = pathToFileURL(join(root, "dist/src/sdk/worker.js")).href;
    const source = block("sdk-example", "ts");
    expect(source).toContain('from "meshwork/worker"');
    expect(source).toContain(README_URL);
    // Plain JavaScript as written: no TypeScript-only syntax to strip.
    const file = join(dir, "worker.mjs");
    writeFileSync(
      file,
      source
        .replace('from "meshwork/worker"', `from ${JSON.stringify(sdk)}`)
        .replace(README_URL, server.url),
    );
    const w = start("node", [file], { ...process.env, MESHWORK_TOKEN: server.workerToken }, dir);
    children.push(w.child);
    await until(() => w.out.stdout.includes("registered as"), 20_000);

    const { task: created } = await wc("one\ntwo\nthree\n");
    const task = await finished(created?.taskId ?? "");
    expect(task?.state, w.out.stderr).toBe(TaskState.SUCCEEDED);
    expect(await bytesOf(task?.result?.uri ?? "")).toBe("3\n");
    expect(task?.resultSummary).toBe("3 lines");

    const { task: empty } = await wc("");
    const failed = await finished(empty?.taskId ?? "");
    expect(failed?.state, w.out.stderr).toBe(TaskState.FAILED);
    expect(failed?.error?.code).toBe("EmptyInput");

    w.child.kill("SIGTERM");
    expect(await within(15_000, w.exited)).toBe(0);
    expect(w.out.stdout + w.out.stderr).not.toContain(server.workerToken);
  });

  it("runs the `meshwork work` example as written: counts lines, exits 0 on SIGTERM", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-readme-work-"));
    // `meshwork` on PATH, as after `npm install` of the package.
    const bin = join(dir, "bin");
    mkdirSync(bin);
    symlinkSync(join(root, "bin/meshwork.js"), join(bin, "meshwork"));
    const source = block("work-example", "sh");
    expect(source).toContain("MESHWORK_TOKEN=…");
    expect(source).toContain(README_URL);
    const script = source
      .replace("MESHWORK_TOKEN=…", `MESHWORK_TOKEN=${server.workerToken}`)
      .replace(README_URL, server.url);
    const shell = start(
      "bash",
      ["-euo", "pipefail", "-c", script],
      { ...process.env, PATH: `${bin}:${process.env.PATH ?? ""}` },
      dir,
    );
    children.push(shell.child);
    await until(() => shell.out.stderr.includes("registered as worker"), 20_000);
    const { task: created } = await wc("a\nb\n");
    const task = await finished(created?.taskId ?? "");
    expect(task?.state, shell.out.stderr).toBe(TaskState.SUCCEEDED);
    expect((await bytesOf(task?.result?.uri ?? "")).trim()).toBe("2");

    process.kill(lastCommandPid(shell.child.pid ?? 0), "SIGTERM");
    expect(await within(15_000, shell.exited)).toBe(0);
  });

  it.skipIf(missingForPythonGrpc("the README's Python gRPC example").length > 0)(
    "runs the Python gRPC example as written: counts lines, exits 0 on SIGTERM",
    async () => {
      // The apt-get line is a block of its own just before this one: the
      // packages are a precondition (checked above), not part of the run.
      expect(readme).toMatch(
        /```sh\napt-get install python3-grpcio python3-protobuf\n```\s*<!-- python-example:start -->/,
      );
      const source = block("python-example", "sh");
      expect(source).toMatch(/^export MESHWORK_TOKEN=mw_\.\.\. /);
      expect(source).toContain("MESHWORK_TOKEN=mw_...");
      expect(source).toContain("--url 127.0.0.1:8080 ");
      const script = source
        .replace("MESHWORK_TOKEN=mw_...", `MESHWORK_TOKEN=${server.workerToken}`)
        .replace("127.0.0.1:8080", new URL(server.url).host);
      // From the repository root, as written: worker.py imports the meshwork
      // package from clients/python (its stubs are committed).
      const shell = start("bash", ["-euo", "pipefail", "-c", script], process.env, root);
      children.push(shell.child);
      await until(() => shell.out.stderr.includes("registered as"), 25_000).catch((error) => {
        throw new Error(`${error}\n${shell.out.stdout}${shell.out.stderr}`);
      });
      const { task: created } = await wc("a\nb\nc\n");
      const task = await finished(created?.taskId ?? "");
      expect(task?.state, shell.out.stderr).toBe(TaskState.SUCCEEDED);
      expect((await bytesOf(task?.result?.uri ?? "")).trim()).toBe("3");

      // An idle worker.py ends its long poll on SIGTERM and exits 0.
      const worker = lastCommandPid(shell.child.pid ?? 0);
      expect(readFileSync(`/proc/${worker}/comm`, "utf8").trim()).toMatch(/^python3/);
      process.kill(worker, "SIGTERM");
      expect(await within(15_000, shell.exited), shell.out.stderr).toBe(0);
      expect(shell.out.stdout + shell.out.stderr).not.toContain(server.workerToken);
    },
    60_000,
  );
});
