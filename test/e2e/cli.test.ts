import { execFile, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { transportFor } from "../../src/cli/connect.js";
import { workerTransport } from "../../src/sdk/rpc.js";
import { within } from "../support/bounded.js";
import { useListeningServer } from "../support/server.js";

const server = useListeningServer({ auth: "on" });
const dir = mkdtempSync(join(tmpdir(), "meshwork-cli-"));
/** No stray MESHWORK_* settings, and a data dir without admin.token. */
const env = {
  PATH: process.env.PATH ?? "",
  HOME: process.env.HOME ?? "",
  MESHWORK_DATA_DIR: join(dir, "none"),
};

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `meshwork ARGS --url … --token …` as a child process, bounded to 20 s. */
function cli(args: string[], auth: string[] = ["--url", server.url, "--token", server.adminToken]) {
  return new Promise<Ran>((resolve) => {
    execFile(
      "node",
      ["bin/meshwork.js", ...args, ...auth],
      { env, timeout: 20_000 },
      (error, stdout, stderr) => {
        const code = error ? ((error as { code?: number }).code ?? null) : 0;
        resolve({ code: typeof code === "number" ? code : null, stdout, stderr });
      },
    );
  });
}

const endpoint = () => ({ url: server.url, token: server.adminToken });
const tasks = () => createClient(TaskService, transportFor(endpoint()));
const fleet = () => createClient(FleetService, transportFor(endpoint()));
const leases = () => createClient(LeaseService, transportFor(endpoint()));

// Each child process starts Node and tsx (about a second on an idle machine).
describe("meshwork operator CLI against a live coordinator with auth on", {
  timeout: 90_000,
}, () => {
  it("creates, gets, lists (table and --json) and cancels a task", async () => {
    const created = await cli([
      "task",
      "create",
      "--workload",
      "cli-basic",
      "--name",
      "first",
      "--param",
      "n=3",
      "--param",
      "who=ops",
    ]);
    expect(created).toMatchObject({ code: 0 });
    const id = created.stdout.trim();
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    expect(created.stderr).toContain(`created task ${id}`);

    const got = await cli(["task", "get", id]);
    expect(got.code).toBe(0);
    expect(got.stdout).toMatch(/^state:\s+PENDING$/m);
    expect(got.stdout).toContain('{"n":3,"who":"ops"}');

    const table = await cli(["task", "list", "--workload", "cli-basic"]);
    expect(table.code).toBe(0);
    const [header, row] = table.stdout.trimEnd().split("\n");
    expect(header).toMatch(/^ID\s+STATE\s+WORKLOAD\s+NAME\s+ATTEMPT/);
    expect(row).toMatch(new RegExp(`^${id}\\s+PENDING\\s+cli-basic\\s+first\\s+0/3`));
    expect(header?.indexOf("STATE")).toBe(row?.indexOf("PENDING"));

    const json = await cli(["task", "list", "--state", "pending", "--json"]);
    expect(json.code).toBe(0);
    const doc = JSON.parse(json.stdout);
    expect(doc.tasks).toContainEqual(
      expect.objectContaining({
        taskId: id,
        state: "TASK_STATE_PENDING",
        parameters: { n: 3, who: "ops" },
      }),
    );

    const canceled = await cli(["task", "cancel", id, "--reason", "not needed"]);
    expect(canceled).toMatchObject({ code: 0, stdout: `task ${id} is CANCELED\n` });
    expect((await tasks().getTask({ taskId: id })).task?.error?.message).toContain("not needed");
    const again = await cli(["task", "cancel", id]);
    expect(again.code).toBe(1);
    expect(again.stderr).toMatch(/^meshwork task cancel: failed_precondition: .+\n$/);
  });

  it("watches a task until another call completes it, then exits 0", async () => {
    const { workerId } = await fleet().registerWorker({
      name: "cli-w",
      capabilities: ["cli-watch"],
    });
    const task = (await tasks().createTask({ workload: "cli-watch" })).task;
    const taskId = task?.taskId ?? "";
    const child = spawn(
      "node",
      [
        "bin/meshwork.js",
        "task",
        "watch",
        taskId,
        "--url",
        server.url,
        "--token",
        server.adminToken,
      ],
      { env },
    );
    let stdout = "";
    child.stdout.on("data", (d: Buffer) => {
      stdout += d.toString();
    });
    const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
    try {
      const seen = await within(
        20_000,
        (async () => {
          while (!stdout.includes("PENDING")) await new Promise((r) => setTimeout(r, 50));
        })(),
      );
      expect(seen).not.toBe("timed out");
      const { claims } = await leases().claimTasks({ workerId, waitSeconds: 5 });
      const claim = claims.find((c) => c.taskId === taskId);
      expect(claim).toBeDefined();
      await leases().completeTask({
        taskId,
        workerId,
        attempt: claim?.attempt ?? 0,
        leaseToken: claim?.leaseToken ?? "",
        resultSummary: "done",
      });
      expect(await within(20_000, exited)).toBe(0);
    } finally {
      child.kill();
    }
    const states = stdout
      .trim()
      .split("\n")
      .map((l) => l.split(/\s+/)[1]);
    expect(states[0]).toBe("PENDING");
    expect(states.at(-1)).toBe("SUCCEEDED");
    expect(stdout).toContain("result done");

    const workers = await cli(["worker", "list"]);
    expect(workers.code).toBe(0);
    expect(workers.stdout).toMatch(new RegExp(`^${workerId}\\s+cli-w\\s+ACTIVE\\s+no\\s+0/1`, "m"));
    const drained = await cli(["worker", "drain", workerId]);
    expect(drained).toMatchObject({ code: 0 });
    expect(drained.stdout).toContain("is drained");
    const listed = await cli(["worker", "list", "--drained", "--json"]);
    expect(JSON.parse(listed.stdout).workers).toEqual([
      expect.objectContaining({ workerId, drained: true }),
    ]);
    const undrained = await cli(["worker", "undrain", workerId, "--json"]);
    expect(JSON.parse(undrained.stdout)).toMatchObject({ workerId });
    expect(JSON.parse(undrained.stdout).drained).toBeUndefined(); // false is the JSON default

    const status = await cli(["fleet", "status"]);
    expect(status.code).toBe(0);
    expect(status.stdout).toMatch(/^TASKS .*SUCCEEDED 1/m);
    expect(status.stdout).toMatch(new RegExp(`^${workerId}\\s+cli-w\\s+ACTIVE`, "m"));
    const statusJson = JSON.parse((await cli(["fleet", "status", "--json"])).stdout);
    expect(statusJson.taskCounts).toContainEqual({ state: "TASK_STATE_SUCCEEDED", count: "1" });
  });

  it("creates a task with an input file and downloads it again, checked", async () => {
    const file = join(dir, "input.bin");
    const bytes = Buffer.from("operator input\n".repeat(1000));
    writeFileSync(file, bytes);
    const created = await cli([
      "task",
      "create",
      "--workload",
      "cli-input",
      "--input",
      file,
      "--json",
    ]);
    expect(created.code).toBe(0);
    const task = JSON.parse(created.stdout);
    const sha = createHash("sha256").update(bytes).digest("hex");
    expect(task.input).toMatchObject({ sha256: sha, sizeBytes: String(bytes.length) });
    const out = join(dir, "got.bin");
    const got = await cli(["artifact", "get", task.input.artifactId, "-o", out]);
    expect(got).toMatchObject({ code: 0 });
    expect(got.stderr).toContain("verified");
    expect(readFileSync(out).equals(bytes)).toBe(true);

    const put = await cli(["artifact", "put", file]);
    expect(put.code).toBe(0);
    const stdout = await cli(["artifact", "get", put.stdout.trim()]);
    expect(stdout.stdout).toBe(bytes.toString());
    const missing = await cli(["artifact", "get", "00000000-0000-4000-8000-000000000000"]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^meshwork artifact get: not_found: .+\n$/);
  });

  it("answers --help, and one line with exit 2 for an unknown flag or a bad value", async () => {
    for (const cmd of [
      ["task", "--help"],
      ["task", "create", "--help"],
      ["worker", "--help"],
      ["fleet", "status", "--help"],
      ["artifact", "--help"],
      ["token", "create", "--help"],
      ["token", "--help"],
      ["task", "rerun", "--help"],
      ["worker", "prune", "--help"],
    ]) {
      const r = await cli(cmd, []);
      expect(r, cmd.join(" ")).toMatchObject({ code: 0, stderr: "" });
      expect(r.stdout).toMatch(/^Usage:/);
    }
    const unknown = await cli(["task", "list", "--fast"]);
    expect(unknown).toMatchObject({
      code: 2,
      stdout: "",
      stderr: "meshwork task list: unknown flag --fast (see 'meshwork task list --help')\n",
    });
    const bad = await cli(["task", "list", "--state", "sleeping"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr.trimEnd().split("\n")).toHaveLength(1);
    expect(bad.stderr).toContain("--state must be one of");
    const priority = await cli(["task", "create", "--workload", "w", "--priority", "high"]);
    expect(priority.code).toBe(2);
    expect(priority.stderr).toContain("--priority must be an integer");
    const negative = await cli(["task", "list", "--limit", "-1"]);
    expect(negative).toMatchObject({ code: 2 });
    expect(negative.stderr).toContain("--limit must be an integer from 1 to 10000");
    // A typo gets a suggestion and the parent's help.
    const typo = await cli(["task", "lst"]);
    expect(typo).toMatchObject({
      code: 2,
      stderr: `meshwork task lst: unknown subcommand "lst" (did you mean "list"?) (see 'meshwork task --help')\n`,
    });
    expect((await cli(["tsk", "list"])).stderr).toMatch(
      /^meshwork: unknown command "tsk" \(did you mean "task"\?\)/,
    );
    // A URL without a scheme: exit 2 and what to write instead.
    const scheme = await cli(["task", "list"], ["--url", "127.0.0.1:8080", "--token", "x"]);
    expect(scheme.code).toBe(2);
    expect(scheme.stderr).toContain('(try "http://127.0.0.1:8080")');
    // Token errors speak as the others do: code: message in snake_case.
    const unknownToken = await cli(["token", "revoke", "no-such-token-name"]);
    expect(unknownToken.code).toBe(1);
    expect(unknownToken.stderr).toMatch(/^meshwork token revoke: not_found: /);
    const noRole = await cli(["token", "create", "--name", "x"]);
    expect(noRole).toMatchObject({ code: 2 });
    expect(noRole.stderr).toContain("missing --role");
  });

  it("exits 1 from knowledge import when every line was rejected, 0 when some went in", async () => {
    const importing = (input: string) =>
      new Promise<Ran>((resolve) => {
        const c = execFile(
          "node",
          [
            "bin/meshwork.js",
            "knowledge",
            "import",
            "--url",
            server.url,
            "--token",
            server.adminToken,
          ],
          { env, timeout: 20_000 },
          (error, stdout, stderr) => {
            const code = error ? ((error as { code?: number }).code ?? null) : 0;
            resolve({ code: typeof code === "number" ? code : null, stdout, stderr });
          },
        );
        c.stdin?.end(input);
      });
    const rejected = await importing('not json\n{"also": "not an entry"}\n');
    expect(rejected.code).toBe(1);
    expect(rejected.stderr).toMatch(/rejected 2/);
    const entry = JSON.stringify({
      kind: "cli-import",
      key: `k-${Date.now()}`,
      value: { a: 1 },
      version: 1,
      origin: "lab-a",
      updatedAt: new Date().toISOString(),
    });
    const some = await importing(`${entry}\nnot json\n`);
    expect(some.code, some.stderr).toBe(0);
    expect(some.stderr).toMatch(/inserted 1, .* rejected 1/);
  });

  it("takes a worker's name where it takes a worker id, and says when a name is shared", async () => {
    const name = `cli-named-${Date.now()}`;
    const workload = `${name}-w`;
    const { workerId } = await fleet().registerWorker({ name, capabilities: [workload] });
    const taskId = (await tasks().createTask({ workload })).task?.taskId ?? "";
    await leases().claimTasks({ workerId });
    const listed = JSON.parse((await cli(["task", "list", "--worker", name, "--json"])).stdout);
    expect(listed.tasks.map((t: { taskId: string }) => t.taskId)).toEqual([taskId]);
    const drained = await cli(["worker", "drain", name]);
    expect(drained.stdout).toContain(`worker ${workerId} (${name}) is drained`);
    await fleet().registerWorker({ name, capabilities: [workload] });
    const shared = await cli(["worker", "drain", name]);
    expect(shared.code).toBe(2);
    expect(shared.stderr).toMatch(/2 workers are named/);
    const nobody = await cli(["task", "list", "--worker", "nobody-has-this-name"]);
    expect(nobody.code).toBe(1);
    expect(nobody.stderr).toMatch(/not_found: no worker has the id, peer id or name/);
    await tasks().cancelTask({ taskId });
  });

  it("reruns a failed task, shows its last lease as ended, and cancels and reruns by filter", async () => {
    const workload = `cli-rerun-${Date.now()}`;
    const workerId = (await fleet().registerWorker({ name: "cli-rerun", capabilities: [workload] }))
      .workerId;
    const created = await tasks().createTasks({
      tasks: [{ workload, maxAttempts: 1, priority: 10 }, { workload }, { workload }],
    });
    const [failing] = created.tasks;
    const taskId = failing?.taskId ?? "";
    const { claims } = await leases().claimTasks({ workerId, maxTasks: 1 });
    const claim = claims.find((c) => c.taskId === taskId);
    if (!claim) throw new Error("the failing task was not claimed");
    await leases().failTask({
      taskId,
      workerId,
      attempt: claim.attempt,
      leaseToken: claim.leaseToken,
      errorCode: "ValueError",
      errorMessage:
        'Traceback (most recent call last):\n  File "/srv/w.py", line 1\nValueError: bad row 7',
    });

    const got = await cli(["task", "get", taskId]);
    expect(got.stdout).toMatch(/^state:\s+FAILED$/m);
    expect(got.stdout).toMatch(/^error:\s+ValueError: ValueError: bad row 7$/m);
    // The lease is over: shown as ended, never as live with a time to run.
    expect(got.stdout).toMatch(/^last lease:\s+worker \S+, attempt 1, ended \S+/m);
    expect(got.stdout).not.toMatch(/^lease:/m);

    const rerun = await cli(["task", "rerun", taskId]);
    expect(rerun, rerun.stderr).toMatchObject({ code: 0, stdout: `task ${taskId} is PENDING\n` });
    const refused = await cli(["task", "rerun", taskId]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/^meshwork task rerun: failed_precondition: .*PENDING.*\n$/);

    // All three wait now: a dry run counts them, then they are cancelled and rerun together.
    const dry = await cli([
      "task",
      "cancel",
      "--workload",
      workload,
      "--state",
      "pending",
      "--dry-run",
    ]);
    expect(dry.stdout).toBe("3 tasks match: a cancel would act on them (dry run)\n");
    const cancelled = await cli([
      "task",
      "cancel",
      "--workload",
      workload,
      "--state",
      "pending",
      "--json",
    ]);
    expect(JSON.parse(cancelled.stdout)).toEqual({ count: 3, dryRun: false });
    const reran = await cli(["task", "rerun", "--workload", workload]);
    expect(reran.stdout).toBe("reran 3 tasks\n");
    const { tasks: now } = await tasks().listTasks({ workload });
    expect(now.map((t) => t.state)).toEqual(Array(3).fill(TaskState.PENDING));

    const bad = await cli(["task", "rerun", "--state", "running"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--state must be one of failed, canceled/);
    const none = await cli(["task", "cancel"]);
    expect(none.code).toBe(2);
    await tasks().cancelTasks({ filter: { workload } });
  });

  it("prunes LOST workers (a dry run counts them); a bad --lost-for is exit 2", async () => {
    const dry = await cli(["worker", "prune", "--lost-for", "1h", "--dry-run", "--json"]);
    expect(dry.code, dry.stderr).toBe(0);
    const { count, dryRun } = JSON.parse(dry.stdout);
    expect(dryRun).toBe(true);
    const pruned = await cli(["worker", "prune", "--lost-for", "1h"]);
    expect(pruned.stdout).toBe(`removed ${count} LOST workers\n`);
    const bad = await cli(["worker", "prune", "--lost-for", "soon"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--lost-for must be a whole number with a unit/);
  });

  it("retries a running task onto another worker (push placement), and deregisters a worker, releasing its leases", async () => {
    const workload = "cli-retry";
    const register = (name: string) =>
      fleet().registerWorker({
        name,
        capabilities: [workload],
        apiBaseUrl: `http://127.0.0.1:1/${name}`,
        maxConcurrency: 1,
      });
    const first = (await register("cli-r1")).workerId;
    const taskId = (await tasks().createTask({ workload })).task?.taskId ?? "";
    const { claims } = await leases().claimTasks({ workerId: first, waitSeconds: 5 });
    expect(claims.map((c) => c.taskId)).toEqual([taskId]);
    const second = (await register("cli-r2")).workerId;

    const retried = await cli(["task", "retry", taskId, "--json"]);
    expect(retried.code, retried.stderr).toBe(0);
    const moved = JSON.parse(retried.stdout);
    expect(moved).toMatchObject({
      taskId,
      state: "TASK_STATE_ASSIGNED",
      attempt: 2,
      assignedWorkerId: second,
      assignedApiBaseUrl: "http://127.0.0.1:1/cli-r2",
    });
    expect(moved.lease.leaseToken).toMatch(/\S/); // for the director to dispatch
    // The first worker's lease is fenced: its completion is refused.
    await expect(
      leases().completeTask({
        taskId,
        workerId: first,
        attempt: claims[0]?.attempt ?? 0,
        leaseToken: claims[0]?.leaseToken ?? "",
      }),
    ).rejects.toThrow(/aborted/);
    const human = await cli(["task", "retry", "not-a-uuid"]);
    expect(human.code).toBe(1);
    expect(human.stderr).toMatch(/^meshwork task retry: invalid_argument: .+\n$/);

    const gone = await cli(["worker", "deregister", second]);
    expect(gone.code, gone.stderr).toBe(0);
    expect(gone.stdout).toBe(`deregistered worker ${second}; released 1 task(s)\n  ${taskId}\n`);
    expect((await tasks().getTask({ taskId })).task?.state).toBe(TaskState.PENDING);
    const listed = JSON.parse((await cli(["worker", "list", "--json"])).stdout);
    expect(listed.workers.map((w: { workerId: string }) => w.workerId)).not.toContain(second);
    const again = await cli(["worker", "deregister", second]);
    expect(again.code).toBe(1);
    expect(again.stderr).toMatch(/^meshwork worker deregister: not_found: .+\n$/);
    await tasks().cancelTask({ taskId });
  });

  it("creates a task with resources and selectors, says why it waits, and sets shares, limits and rates", async () => {
    const created = await cli([
      "task",
      "create",
      "--workload",
      "cli-sched",
      "--resources",
      "gpu=2,memory=4096",
      "--require",
      "model in (a100,h100)",
      "--require",
      "!spot",
      "--prefer",
      "50:disk=ssd",
      "--share",
      "lab/cli",
      "--concurrency-key",
      "cli-licence",
    ]);
    expect(created.code).toBe(0);
    const id = created.stdout.trim();
    const got = await cli(["task", "get", id]);
    expect(got.stdout).toMatch(/^resources:\s+gpu=2,memory=4096,slots=1$/m);
    expect(got.stdout).toMatch(/^requires:\s+model in \(a100,h100\); !spot$/m);
    expect(got.stdout).toMatch(/^prefers:\s+50:disk=ssd$/m);
    expect(got.stdout).toMatch(/^share:\s+lab\/cli$/m);
    const why = await cli(["task", "why", id]);
    expect(why.code).toBe(0);
    expect(why.stdout).toMatch(/^position 1 in its share's queue$/m);
    expect(why.stdout).toMatch(/^no matching worker: /m);

    expect((await cli(["share", "set", "lab/cli", "3"])).code).toBe(0);
    const sibling = ["task", "create", "--workload", "cli-sched", "--share", "lab/other"];
    expect((await cli(sibling)).code).toBe(0);
    const shares = await cli(["share", "list"]);
    // Other tests' tasks make other active shares (their tokens' names), so
    // lab's part depends on them; lab/cli (weight 3) gets three quarters of
    // it beside lab/other (weight 1).
    const entitled = (path: string) =>
      Number(shares.stdout.match(new RegExp(`^\\s*${path}\\s+\\d+\\s+(\\d+\\.\\d)%`, "m"))?.[1]);
    expect(shares.stdout).toMatch(/^\s+lab\/cli\s+3\s/m);
    expect(entitled("lab")).toBeGreaterThan(0);
    expect(Math.abs(entitled("lab/cli") - 0.75 * entitled("lab"))).toBeLessThanOrEqual(0.1);
    expect(Math.abs(entitled("lab/other") - 0.25 * entitled("lab"))).toBeLessThanOrEqual(0.1);
    expect((await cli(["limit", "set", "cli-licence", "2"])).code).toBe(0);
    expect((await cli(["limit", "list"])).stdout).toMatch(/^cli-licence\s+0\s+2\s+1$/m);
    expect((await cli(["rate", "set", "cli-api", "2.5", "--burst", "5"])).code).toBe(0);
    expect((await cli(["rate", "list"])).stdout).toMatch(/^cli-api\s+2\.5\s+5\s+5\.00/m);
    expect((await cli(["rate", "delete", "cli-api"])).stdout).toBe("rate cli-api removed\n");
    const bad = await cli(["task", "create", "--workload", "x", "--require", "model ~ a100"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--require takes");
  });

  it("prints a task's log lines (task logs) and follows them until the task ends (-f)", async () => {
    const workload = `logs-${Date.now()}`;
    const { workerId } = await fleet().registerWorker({ name: "logger", capabilities: [workload] });
    const { task } = await tasks().createTask({ workload });
    const {
      claims: [claim],
    } = await leases().claimTasks({ workerId, maxTasks: 1 });
    const lease = {
      taskId: task?.taskId ?? "",
      workerId,
      attempt: 1,
      leaseToken: claim?.leaseToken ?? "",
    };
    // AppendLogs is a client stream: gRPC (HTTP/2), as workers send it.
    const grpcLeases = createClient(LeaseService, workerTransport(server.url, server.adminToken));
    const send = (...texts: string[]) =>
      grpcLeases.appendLogs(
        (async function* () {
          for (const text of texts) yield { ...lease, text, stream: "stdout" };
        })(),
      );
    expect(await send("hello", "world")).toMatchObject({ accepted: 2 });
    const printed = await cli(["task", "logs", lease.taskId]);
    expect(printed).toMatchObject({ code: 0, stdout: "hello\nworld\n" });
    const following = cli(["task", "logs", lease.taskId, "-f"]);
    await send("more");
    await leases().completeTask(lease);
    const followed = await following;
    expect(followed.code, followed.stderr).toBe(0);
    expect(followed.stdout).toBe("hello\nworld\nmore\n");
  });

  it("creates delayed, dependent and time-bound tasks, shows them, and reruns a failed task with its dependents", async () => {
    const workload = `cli-flow-${Date.now()}`;
    const later = await cli([
      "task",
      "create",
      "--workload",
      workload,
      "--in",
      "1h",
      "--timeout",
      "5m",
    ]);
    expect(later.code, later.stderr).toBe(0);
    const laterId = later.stdout.trim();
    const shown = await cli(["task", "get", laterId]);
    expect(shown.stdout).toMatch(/run at:\s+\S+/);
    expect(shown.stdout).toMatch(/timeout:\s+300 s per attempt/);
    const first = (
      await cli(["task", "create", "--workload", workload, "--max-attempts", "1"])
    ).stdout.trim();
    const dependent = await cli(["task", "create", "--workload", workload, "--depends-on", first]);
    expect(dependent.code, dependent.stderr).toBe(0);
    const dependentId = dependent.stdout.trim();
    expect((await cli(["task", "get", dependentId])).stdout).toMatch(
      new RegExp(`depends on:\\s+${first} \\(all succeeded; 1 pending\\)`),
    );
    expect((await cli(["task", "why", dependentId])).stdout).toContain("dependencies");
    const both = await cli(["task", "create", "--workload", workload, "--at", "not a time"]);
    expect(both.code).toBe(2);

    // The first fails; its dependent fails with it; --dependents brings both back.
    const workerId = (await fleet().registerWorker({ capabilities: [workload], maxConcurrency: 5 }))
      .workerId;
    const { claims } = await leases().claimTasks({ workerId, maxTasks: 5 });
    expect(claims.map((c) => c.taskId)).toEqual([first]);
    const [c] = claims;
    await leases().failTask({
      taskId: first,
      workerId,
      attempt: c?.attempt ?? 0,
      leaseToken: c?.leaseToken ?? "",
      errorCode: "Boom",
      retryable: false,
    });
    expect((await tasks().getTask({ taskId: dependentId })).task?.error?.code).toBe(
      "DEPENDENCY_FAILED",
    );
    const rerun = await cli(["task", "rerun", first, "--dependents"]);
    expect(rerun.code, rerun.stderr).toBe(0);
    expect((await tasks().getTask({ taskId: dependentId })).task?.state).toBe(TaskState.PENDING);
  });

  it("refuses a bad token with one clear line and exit 1, without printing the token", async () => {
    const secret = "mw_not-a-real-token-0123456789";
    const r = await cli(["task", "list"], ["--url", server.url, "--token", secret]);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe("");
    expect(r.stderr).toMatch(/^meshwork task list: unauthenticated: .*--token.*\n$/);
    expect(r.stderr).not.toContain(secret);
  });
});
