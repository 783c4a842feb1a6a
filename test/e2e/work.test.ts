import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { type AddressInfo, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { until, within } from "../support/bounded.js";
import { uniqueWorkload } from "../support/harness.js";
import { adminTasks, bytesAt, finishedTask, useListeningServer } from "../support/server.js";

// `meshwork work … -- sh -c '…'` as a child process against a coordinator
// with auth on: parameters on stdin and in the environment, the input as a
// file, the output folder uploaded, progress lines, failures with the stderr
// tail, no token in the command's environment, dependencies' outputs as
// files and a result value, and SIGTERM.

/** What the command does, chosen by the task's parameters. */
const script = `
stdin=$(cat)
case "$MESHWORK_PARAMETERS" in
  *fail*) echo "first line" >&2; printf 'boom \\033[31mred\\033[0m\\n' >&2; exit 3 ;;
  *env*) env > "$MESHWORK_OUTPUT/env.txt"; exit 0 ;;
  *last*) echo "progress: 1 rendering"; echo "progress: 2 all done"; exit 0 ;;
  *produce*) echo "a,b,c" > "$MESHWORK_OUTPUT/data.csv"
    printf '{"rows": 1, "by": "%s"}' "$MESHWORK_TASK_ID" > "$MESHWORK_RESULT_VALUE"; exit 0 ;;
  *consume*) printf '{"data": "%s", "result": "%s", "files": "%s"}' \
      "$(cat "$MESHWORK_INPUTS_DIR/prep/data.csv")" "$(cat "$MESHWORK_INPUTS_DIR/prep/result")" \
      "$(cd "$MESHWORK_INPUTS_DIR" && echo */*)" > "$MESHWORK_RESULT_VALUE"; exit 0 ;;
  *badjson*) echo '{"not": json' > "$MESHWORK_RESULT_VALUE"; exit 0 ;;
  *bigvalue*) { printf '{"x": "'; head -c 70000 /dev/zero | tr '\\0' x; printf '"}'; } > "$MESHWORK_RESULT_VALUE"; exit 0 ;;
  *hang*) sleep "$(printf '%s' "$MESHWORK_PARAMETERS" | tr -dc '0-9.')" & wait; exit 0 ;;
esac
{ printf '%s|%s|%s|' "$stdin" "$MESHWORK_PARAMETERS" "$MESHWORK_TASK_ID"; cat "$MESHWORK_INPUT"; } > "$MESHWORK_OUTPUT/a-result.txt"
echo second > "$MESHWORK_OUTPUT/b-other.txt"
echo "progress: 1 halfway there"
sleep 4
`;

describe("meshwork work", () => {
  const server = useListeningServer({
    auth: "on",
    blobDir: mkdtempSync(join(tmpdir(), "meshwork-work-blobs-")),
  });
  let child: ChildProcess | undefined;
  let stdout = "";
  let stderr = "";
  let exited: Promise<number | null> = Promise.resolve(null);
  const workload = uniqueWorkload("cli-work");
  const tasks = () => adminTasks(server);
  const finished = (taskId: string) => finishedTask(server, taskId);
  const bytesOf = (uri: string) => bytesAt(server, uri);

  beforeAll(async () => {
    const { url, workerToken } = server;
    child = spawn(
      "node",
      [
        "bin/meshwork.js",
        "work",
        "--url",
        url,
        "--token",
        workerToken,
        "--workload",
        workload,
      ].concat(["--concurrency", "2", "--", "sh", "-c", script]),
      {
        // The token also in MESHWORK_TOKEN: the command must not see it there either.
        env: {
          PATH: process.env.PATH ?? "",
          HOME: process.env.HOME ?? "",
          MESHWORK_TOKEN: workerToken,
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
    const c = child;
    exited = new Promise((resolve) => c.once("exit", (code) => resolve(code)));
    await until(() => stderr.includes("registered as worker"), 20_000);
  });
  afterAll(() => {
    if (child?.exitCode === null) child.kill("SIGKILL");
  });

  it("runs the command: parameters on stdin and in the environment, the input as a file, the first output file as the result, progress recorded", async () => {
    const { task: created } = await tasks().createTask({
      workload,
      parameters: { greeting: "hi" },
      input: { case: "inputData", value: new TextEncoder().encode("hello input") },
      leaseSeconds: 5,
      steps: 2,
    });
    const taskId = created?.taskId ?? "";
    await until(async () => {
      const { task } = await tasks().getTask({ taskId });
      return task?.progress?.completedSteps === 1;
    }, 20_000);
    const { task: during } = await tasks().getTask({ taskId });
    expect(during?.progress?.message).toBe("halfway there");
    const task = await finished(taskId);
    expect(task?.state, stderr).toBe(TaskState.SUCCEEDED);
    const params = '{"greeting":"hi"}';
    expect(await bytesOf(task?.result?.uri ?? "")).toBe(
      `${params}|${params}|${taskId}|hello input`,
    );
    expect(task?.resultSummary).toBe("2 output files");
    expect(stdout).toContain(`start ${taskId}`);
    expect(stdout).toContain(`done ${taskId}`);
  });

  it("keeps the last progress a command reports just before it exits", async () => {
    const { tasks: created } = await tasks().createTasks({
      tasks: Array.from({ length: 3 }, () => ({
        workload,
        parameters: { mode: "last" },
        steps: 2,
      })),
    });
    for (const t of created) {
      const task = await finished(t.taskId);
      expect(task?.state, stderr).toBe(TaskState.SUCCEEDED);
      expect(task?.progress).toMatchObject({ completedSteps: 2, message: "all done" });
    }
  });

  it("fails the task with CommandFailed, the exit status and the stderr tail without control characters", async () => {
    const { task: created } = await tasks().createTask({
      workload,
      parameters: { mode: "fail" },
      maxAttempts: 1,
    });
    const taskId = created?.taskId ?? "";
    const task = await finished(taskId);
    expect(task?.state).toBe(TaskState.FAILED);
    expect(task?.error?.code).toBe("CommandFailed");
    expect(task?.error?.message).toContain("exit status 3");
    expect(task?.error?.message).toMatch(/first line\sboom \[31mred\[0m/);
    expect(task?.error?.message).not.toContain("\x1b");
    expect(stdout).toContain(`failed ${taskId}`);
  });

  it("forwards the command's stdout and stderr lines to the task's log", async () => {
    const { tasks: created } = await tasks().createTasks({
      tasks: [
        { workload, parameters: { mode: "fail" }, maxAttempts: 1 },
        { workload, parameters: { mode: "last" } },
      ],
    });
    const [failed, last] = created.map((t) => t.taskId);
    for (const id of [failed, last]) await finished(id ?? "");
    const logOf = async (taskId = "") =>
      (await tasks().getTaskLogs({ taskId })).lines.map((l) => [l.stream, l.text]);
    expect(await logOf(failed)).toEqual([
      ["stderr", "first line"],
      ["stderr", "boom \x1b[31mred\x1b[0m"],
    ]);
    expect(await logOf(last)).toEqual([
      ["stdout", "progress: 1 rendering"],
      ["stdout", "progress: 2 all done"],
    ]);
  });

  it("stops the command's whole process group when its task is cancelled, and goes on with the next task", async () => {
    // A child of the command's shell, found by its unique argument.
    const seconds = String(1000 + Math.floor(Math.random() * 9000));
    const sleeping = () =>
      spawnSync("pgrep", ["-f", `^sleep ${seconds}$`], { encoding: "utf8" }).stdout.trim();
    const { task: created } = await tasks().createTask({
      workload,
      parameters: { mode: "hang", seconds: Number(seconds) },
    });
    const taskId = created?.taskId ?? "";
    await until(() => sleeping() !== "", 20_000);
    await tasks().cancelTask({ taskId, reason: "changed my mind" });
    await until(() => sleeping() === "", 15_000);
    await until(() => stdout.includes(`stopped ${taskId}`), 15_000);
    const { task } = await tasks().getTask({ taskId });
    expect(task?.state).toBe(TaskState.CANCELED);
    // The cancellation's reason, not a CommandFailed from the killed command.
    expect(task?.error?.code).not.toBe("CommandFailed");
    expect(task?.error?.message).toContain("changed my mind");
    // The worker goes on: the next task runs.
    const { task: next } = await tasks().createTask({ workload, parameters: { mode: "env" } });
    expect((await finished(next?.taskId ?? ""))?.state, stderr).toBe(TaskState.SUCCEEDED);
  });

  it("gives the command its dependencies' outputs in $MESHWORK_INPUTS_DIR and keeps what it writes to $MESHWORK_RESULT_VALUE", async () => {
    const { tasks: created } = await tasks().createTasks({
      tasks: [
        { workload, ref: "prep", parameters: { mode: "produce" } },
        { workload, dependsOn: ["ref:prep"], parameters: { mode: "consume" } },
      ],
    });
    const [prepId, useId] = created.map((t) => t.taskId) as [string, string];
    const prep = await finished(prepId);
    expect(prep?.state, stderr).toBe(TaskState.SUCCEEDED);
    expect(prep?.resultValue).toEqual({ rows: 1, by: prepId });
    const use = await finished(useId);
    expect(use?.state, `${use?.error?.message}\n${stderr}`).toBe(TaskState.SUCCEEDED);
    expect(use?.resultValue).toEqual({
      data: "a,b,c",
      result: "a,b,c",
      files: "prep/data.csv prep/result",
    });
  });

  it("fails a task whose $MESHWORK_RESULT_VALUE is not JSON or is over 64 KiB, without retrying", async () => {
    const { tasks: created } = await tasks().createTasks({
      tasks: ["badjson", "bigvalue"].map((mode) => ({ workload, parameters: { mode } })),
    });
    const [bad, big] = await Promise.all(created.map((t) => finished(t.taskId)));
    expect(bad?.state, stderr).toBe(TaskState.FAILED);
    expect(bad?.attempt).toBe(1);
    expect(bad?.error?.code).toBe("ResultValueInvalid");
    expect(bad?.error?.message).toContain("not valid JSON");
    expect(big?.state).toBe(TaskState.FAILED);
    expect(big?.error?.code).toBe("ResultValueTooLarge");
  });

  it("does not pass the worker's token to the command", async () => {
    const { task: created } = await tasks().createTask({ workload, parameters: { mode: "env" } });
    const taskId = created?.taskId ?? "";
    const task = await finished(taskId);
    expect(task?.state, stderr).toBe(TaskState.SUCCEEDED);
    const env = await bytesOf(task?.result?.uri ?? "");
    expect(env).toContain(`MESHWORK_TASK_ID=${taskId}`);
    expect(env).toContain("MESHWORK_INPUT=\n");
    expect(env).toMatch(/MESHWORK_INPUTS_DIR=\/.+\/inputs\n/);
    expect(env).toMatch(/MESHWORK_RESULT_VALUE=\/.+\n/);
    expect(env).not.toContain(server.workerToken);
    expect(env).not.toContain("MESHWORK_TOKEN");
  });

  it("refuses to run without a worker token, even with an admin token file in the data dir", () => {
    const dataDir = mkdtempSync(join(tmpdir(), "meshwork-work-data-"));
    writeFileSync(join(dataDir, "admin.token"), `${server.adminToken}\n`);
    const r = spawnSync(
      "node",
      ["bin/meshwork.js", "work", "--url", server.url, "--workload", workload, "--", "true"],
      {
        env: { PATH: process.env.PATH ?? "", MESHWORK_DATA_DIR: dataDir },
        cwd: process.cwd(),
        encoding: "utf8",
        timeout: 30_000,
      },
    );
    expect(r.status).toBe(2);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).toContain("needs a worker token");
    expect(r.stderr).not.toContain(server.adminToken);
  });

  it("says at once that it cannot reach a wrong URL, gives up with one line naming it, and hints at a missing scheme", async () => {
    const closed = await new Promise<number>((resolve) => {
      const s = createServer().listen(0, "127.0.0.1", () => {
        const { port } = s.address() as AddressInfo;
        s.close(() => resolve(port));
      });
    });
    const url = `http://127.0.0.1:${closed}`;
    const run = (u: string) =>
      new Promise<{ status: number | null; stderr: string }>((resolve) => {
        const c = spawn(
          "node",
          [
            "bin/meshwork.js",
            "work",
            "--url",
            u,
            "--token",
            "x",
            "--workload",
            workload,
            "--",
            "true",
          ],
          { env: { PATH: process.env.PATH ?? "" }, stdio: ["ignore", "ignore", "pipe"] },
        );
        let err = "";
        c.stderr?.on("data", (d) => {
          err += String(d);
        });
        c.once("exit", (status) => resolve({ status, stderr: err }));
      });
    const wrong = await run(url);
    expect(wrong.status).toBe(1);
    const lines = wrong.stderr.trim().split("\n");
    expect(lines[0]).toMatch(
      new RegExp(`cannot reach the coordinator at ${url} .*ECONNREFUSED.*; retrying`),
    );
    expect(lines.at(-1)).toMatch(
      new RegExp(`could not register with the coordinator at ${url}: .*ECONNREFUSED`),
    );
    const bare = await run(`127.0.0.1:${closed}`);
    expect(bare.status).toBe(2);
    expect(bare.stderr).toContain(`(try "http://127.0.0.1:${closed}")`);
    expect(bare.stderr).not.toMatch(/TypeError|\n\s+at /);
  });

  it("exits 0 on SIGTERM", async () => {
    child?.kill("SIGTERM");
    expect(await within(15_000, exited)).toBe(0);
    expect(stderr).not.toContain(server.workerToken);
  });
});
