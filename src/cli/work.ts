import { spawn } from "node:child_process";
import { createReadStream } from "node:fs";
import { mkdir, mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import {
  createPushWorker,
  createWorker,
  type PushWorkerOptions,
  type TaskContext,
  TaskError,
  type TaskResult,
  type WorkerTask,
} from "../sdk/worker.js";
import { endpointOf, type Io, intFlag, parse, runCommand, stdio, UsageError } from "./args.js";
import { quantities } from "./scheduling-flags.js";
import { resultValueAt, saveNamedInputs } from "./work-inputs.js";

const usage = `Usage:
  meshwork work --url U --token T --workload W [--workload W2]... [--concurrency N]
                [--capability C]... [--label K=V]... [--capacity NAME=N,...]
                [--name NAME] [--listen ADDR [--api-base-url URL] [--dispatch-path P]]
                -- COMMAND [ARGS]...

Runs a worker that runs COMMAND once per task it claims (or, with --listen,
once per task the coordinator pushes to it), in a fresh temp dir:
  stdin                 the task's parameters as JSON
  MESHWORK_PARAMETERS   the same JSON
  MESHWORK_INPUT        the path of the downloaded input file ("" when the task has none)
  MESHWORK_INPUTS_DIR   a folder holding the OUTPUT artifacts of the task's dependencies,
                        downloaded and checked: <ref or task id>/<filename>, and
                        <ref or task id>/result for a dependency's result artifact
                        (<ref> when the dependency had one in its CreateTasks call)
  MESHWORK_OUTPUT       an empty folder for the command's output files
  MESHWORK_RESULT_VALUE a path (no file there yet) where the command may write a JSON
                        object: the task's result_value (at most 64 KiB)
  MESHWORK_TASK_ID      the task id
  MESHWORK_RESOURCES    what the task's lease holds here, as JSON ({"gpu":1,"slots":1})
  TRACEPARENT           the task's W3C trace context (continue its trace: docs/tracing.md)
  TRACESTATE            the task's W3C tracestate (unset when it has none)
The worker's token is not passed on (MESHWORK_TOKEN and MESHWORK_DISPATCH_SECRET
are removed from the environment).

Exit 0: every regular file in MESHWORK_OUTPUT is uploaded (OUTPUT kind) and
  the task completes with the first one by name as its result (no result when
  the folder is empty). Name the file you want as the result so it sorts first.
  A JSON object written to MESHWORK_RESULT_VALUE becomes the task's result
  value; anything else there fails the task, not retried, with error code
  ResultValueInvalid (not JSON, or not an object) or ResultValueTooLarge (over 64 KiB).
Non-zero exit: the task fails with error code CommandFailed, the exit status
  and the last lines of stderr (at most 4 KiB, control characters removed).
A stdout line 'progress: N message' records N completed steps.
Every line of stdout and stderr goes to the task's log: meshwork task logs ID [-f].
When the task's lease is lost or it is cancelled, the command's process group
  gets SIGTERM (SIGKILL 5 s later).
SIGTERM/SIGINT stop claiming; running commands finish within the grace period.

With --listen it is a push worker: it listens on ADDR, registers with its
api_base_url, and takes the tasks the coordinator dispatches to it
(POST {api_base_url}/meshwork/tasks): each request's X-Meshwork-Signature
(HMAC-SHA256 with its dispatch secret, at most 5 minutes old) is checked,
a forged or stale one is refused with 401 and nothing runs; an accepted
task is started (StartTask), renewed and completed as a claimed one. The
dispatch secret is $MESHWORK_DISPATCH_SECRET (32-256 characters) or, without
it, 32 random bytes made at each start.

On a terminal, one status line (done, failed, running tasks, elapsed) is
redrawn in place; otherwise one log line per task start and end.

Flags:
  --url URL           the coordinator; default $MESHWORK_URL or http://127.0.0.1:8080
  --token T           a worker token; default $MESHWORK_TOKEN (prefer the variable:
                      a flag is visible to the commands in the process list).
                      Required: the admin token file is never used to run commands.
  --workload W        a workload to run (repeatable, at least one)
  --capability C      a further capability to register (repeatable)
  --label K=V         a label, matched by tasks' affinity, requirements and preferences (repeatable)
  --capacity NAME=N   what the worker offers besides its slots, e.g. gpu=2,license/houdini=1
                      (cpu in millicores and memory in MiB default to the host's)
  --concurrency N     commands run at once; default 1
  --name NAME         the worker's name; default the host name
  --listen ADDR       take pushed work instead of claiming: HOST:PORT, :PORT or PORT
                      (every interface); port 0 picks a free one, logged at start
  --api-base-url URL  where the coordinator reaches this worker; default
                      http://HOST:PORT as bound (the host name when on every interface)
  --dispatch-path P   the path dispatches are POSTed to; default /meshwork/tasks
  -h, --help          this help
`;

const options = {
  url: { type: "string" },
  token: { type: "string" },
  workload: { type: "string", multiple: true },
  capability: { type: "string", multiple: true },
  label: { type: "string", multiple: true },
  capacity: { type: "string", multiple: true },
  concurrency: { type: "string" },
  name: { type: "string" },
  listen: { type: "string" },
  "api-base-url": { type: "string" },
  "dispatch-path": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

/** The most stderr kept for a failure message. */
const stderrTailBytes = 4096;

/** --label K=V flags as a map. */
function labelsOf(pairs: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of pairs) {
    const at = p.indexOf("=");
    if (at <= 0) throw new UsageError(`--label takes K=V, not ${JSON.stringify(p)}`);
    out[p.slice(0, at)] = p.slice(at + 1);
  }
  return out;
}
const progressLine = /^progress: (\d+) (.*)$/;

/** Text without control characters (newlines and tabs kept), at most `max` bytes from the end. */
export function sanitizeTail(text: string, max = stderrTailBytes): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: removing them is the point
  const clean = text.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g, "");
  const bytes = Buffer.from(clean, "utf8");
  if (bytes.length <= max) return clean.trimEnd();
  // Cut at a line start when there is one, dropping a partial first character.
  const tail = bytes
    .subarray(bytes.length - max)
    .toString("utf8")
    .replace(/^\uFFFD+/, "");
  const nl = tail.indexOf("\n");
  return (nl >= 0 && nl < tail.length - 1 ? tail.slice(nl + 1) : tail).trimEnd();
}

/** The status shown on a terminal or logged per task. */
export interface Status {
  start(task: WorkerTask): void;
  end(task: WorkerTask, outcome: string, ok: boolean): void;
  close(): void;
}

/** The status line on a terminal (redrawn in place), or one log line per task start and end. */
export function createStatus(io: Io, tty: boolean): Status {
  const started = Date.now();
  const current = new Set<string>();
  let done = 0;
  let failed = 0;
  const elapsed = () => {
    const s = Math.floor((Date.now() - started) / 1000);
    return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  };
  const draw = () => {
    const running = [...current];
    const shown =
      running.length === 0
        ? "idle"
        : `running ${running.slice(0, 3).join(", ")}${running.length > 3 ? ` +${running.length - 3}` : ""}`;
    io.out.write(`\r\x1b[2Kdone ${done}  failed ${failed}  ${shown}  ${elapsed()}`);
  };
  const timer = tty ? setInterval(draw, 1000) : undefined;
  timer?.unref();
  if (tty) draw();
  return {
    start(task) {
      current.add(task.id);
      if (tty) draw();
      else io.out.write(`${new Date().toISOString()} start ${task.id} (attempt ${task.attempt})\n`);
    },
    end(task, outcome, ok) {
      current.delete(task.id);
      if (ok) done++;
      else failed++;
      if (tty) draw();
      else io.out.write(`${new Date().toISOString()} ${outcome} ${task.id}\n`);
    },
    close() {
      if (timer) clearInterval(timer);
      if (tty) {
        draw();
        io.out.write("\n");
      }
    },
  };
}

/**
 * The environment a command gets: the worker's, without its token and its
 * own trace context, plus the task's (TRACEPARENT and TRACESTATE only when
 * the task has them).
 */
export function commandEnv(
  extra: Record<string, string>,
  task: Pick<WorkerTask, "traceparent" | "tracestate">,
): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.MESHWORK_TOKEN;
  delete env.MESHWORK_DISPATCH_SECRET;
  delete env.TRACEPARENT;
  delete env.TRACESTATE;
  if (task.traceparent) env.TRACEPARENT = task.traceparent;
  if (task.traceparent && task.tracestate) env.TRACESTATE = task.tracestate;
  return { ...env, ...extra };
}

/** Runs `argv` for one task in its own temp dir; see `usage`. */
async function runTask(argv: string[], task: WorkerTask, ctx: TaskContext): Promise<TaskResult> {
  const dir = await mkdtemp(join(tmpdir(), "meshwork-work-"));
  try {
    const output = join(dir, "output");
    await mkdir(output);
    let inputPath = "";
    if (task.input) {
      inputPath = join(dir, "input");
      await ctx.saveInput(inputPath); // streamed: never held in memory whole
    }
    const inputsDir = join(dir, "inputs");
    await saveNamedInputs(ctx, inputsDir);
    const resultValuePath = join(dir, "result-value.json");
    const parameters = JSON.stringify(task.parameters);
    const [command, ...args] = argv as [string, ...string[]];
    const child = spawn(command, args, {
      cwd: dir,
      detached: true, // its own process group, killed as one
      stdio: ["pipe", "pipe", "pipe"],
      env: commandEnv(
        {
          MESHWORK_PARAMETERS: parameters,
          MESHWORK_INPUT: inputPath,
          MESHWORK_INPUTS_DIR: inputsDir,
          MESHWORK_OUTPUT: output,
          MESHWORK_RESULT_VALUE: resultValuePath,
          MESHWORK_TASK_ID: task.id,
          MESHWORK_RESOURCES: JSON.stringify(task.resources),
        },
        task,
      ),
    });
    const killGroup = (signal: NodeJS.Signals) => {
      if (child.pid === undefined) return;
      try {
        process.kill(-child.pid, signal);
      } catch {
        // already gone
      }
    };
    let killTimer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      killGroup("SIGTERM");
      killTimer = setTimeout(() => killGroup("SIGKILL"), 5000);
      killTimer.unref();
    };
    if (ctx.signal.aborted) onAbort();
    else ctx.signal.addEventListener("abort", onAbort, { once: true });

    child.stdin.on("error", () => {}); // the command may not read its stdin
    child.stdin.end(parameters);
    let stderr = "";
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk: string) => {
      stderr = (stderr + chunk).slice(-4 * stderrTailBytes);
    });
    // Every line of stdout and stderr goes to the task's log (meshwork task logs ID).
    createInterface({ input: child.stderr, crlfDelay: Number.POSITIVE_INFINITY }).on(
      "line",
      (line) => ctx.log(line, "stderr"),
    );
    const lines = createInterface({ input: child.stdout, crlfDelay: Number.POSITIVE_INFINITY });
    lines.on("line", (line) => {
      ctx.log(line, "stdout");
      const m = progressLine.exec(line);
      if (m) ctx.progress(Number(m[1]), m[2]);
    });
    const exit = await new Promise<{ code: number | null; signal: NodeJS.Signals | null }>(
      (resolve, reject) => {
        child.once("error", reject);
        child.once("close", (code, signal) => resolve({ code, signal }));
      },
    ).finally(() => {
      ctx.signal.removeEventListener("abort", onAbort);
      if (killTimer) clearTimeout(killTimer);
    });
    if (exit.code !== 0) {
      const status = exit.signal ? `signal ${exit.signal}` : `exit status ${exit.code}`;
      const tail = sanitizeTail(stderr);
      throw new TaskError(
        "CommandFailed",
        `command failed with ${status}${tail ? `: ${tail}` : ""}`,
      );
    }
    const value = await resultValueAt(resultValuePath);
    const entries = await readdir(output, { withFileTypes: true });
    const files = entries
      .filter((e) => e.isFile())
      .map((e) => e.name)
      .sort();
    let result: TaskResult["result"];
    for (const name of files) {
      const artifact = await ctx.upload(name, createReadStream(join(output, name)));
      result ??= artifact;
    }
    return {
      result,
      summary: `${files.length} output file${files.length === 1 ? "" : "s"}`,
      value,
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** The push worker of `--listen`, its flags checked (UsageError). */
function pushWorker(
  common: Omit<PushWorkerOptions, "listen">,
  values: { listen?: string; "api-base-url"?: string; "dispatch-path"?: string },
) {
  const listen = values.listen ?? "";
  if (!/^(\[[^\]]+\]:|[^:[\]]*:)?\d{1,5}$/.test(listen)) {
    throw new UsageError(`--listen takes HOST:PORT, :PORT or PORT, not ${JSON.stringify(listen)}`);
  }
  const apiBaseUrl = values["api-base-url"];
  if (apiBaseUrl !== undefined && !/^https?:\/\/[^/]/i.test(apiBaseUrl)) {
    throw new UsageError("--api-base-url must be an http:// or https:// URL");
  }
  const dispatchPath = values["dispatch-path"];
  if (dispatchPath !== undefined && !dispatchPath.startsWith("/")) {
    throw new UsageError("--dispatch-path must start with /");
  }
  const dispatchSecret = process.env.MESHWORK_DISPATCH_SECRET || undefined;
  if (dispatchSecret !== undefined && (dispatchSecret.length < 32 || dispatchSecret.length > 256)) {
    throw new UsageError("$MESHWORK_DISPATCH_SECRET must be 32-256 characters");
  }
  return createPushWorker({
    ...common,
    listen,
    ...(apiBaseUrl === undefined ? {} : { apiBaseUrl }),
    ...(dispatchPath === undefined ? {} : { dispatchPath }),
    ...(dispatchSecret === undefined ? {} : { dispatchSecret }),
  });
}

/** `meshwork work …`: a worker that runs a command per task. */
export async function workCommand(argv: string[], io: Io = stdio): Promise<number> {
  return runCommand(
    "meshwork work",
    io,
    async () => {
      const split = argv.indexOf("--");
      const flags = split >= 0 ? argv.slice(0, split) : argv;
      const command = split >= 0 ? argv.slice(split + 1) : [];
      const { values, positionals } = parse(flags, options);
      if (values.help) {
        io.out.write(usage);
        return 0;
      }
      if (positionals.length > 0) {
        throw new UsageError(
          `unexpected argument ${JSON.stringify(positionals[0])} (put the command after --)`,
        );
      }
      const workloads = values.workload ?? [];
      if (workloads.length === 0) throw new UsageError("missing --workload");
      if (command.length === 0) throw new UsageError("missing the command after --");
      const concurrency = intFlag("concurrency", values.concurrency, 1, 10_000) ?? 1;
      // Only a token given for the purpose: never the local admin token
      // file, which the commands this runs could then read too.
      if (!values.token && !process.env.MESHWORK_TOKEN) {
        throw new UsageError(
          "needs a worker token: set $MESHWORK_TOKEN (or --token); the admin token file is not used to run commands",
        );
      }
      const endpoint = endpointOf(values);
      const tty = (io.out as NodeJS.WriteStream).isTTY === true;
      const status = createStatus(io, tty);
      const log = (m: string) => {
        if (tty) io.out.write("\r\x1b[2K");
        io.err.write(`meshwork work: ${m}\n`);
      };
      if (values.listen === undefined && (values["api-base-url"] ?? values["dispatch-path"])) {
        throw new UsageError("--api-base-url and --dispatch-path go with --listen");
      }
      const common: Omit<PushWorkerOptions, "listen"> = {
        url: endpoint.url,
        token: endpoint.token,
        workloads,
        capabilities: values.capability ?? [],
        labels: labelsOf(values.label ?? []),
        capacity: Object.fromEntries(
          Object.entries(quantities("capacity", values.capacity ?? [])).map(([k, v]) => [
            k,
            Number(v),
          ]),
        ),
        ...(values.name === undefined ? {} : { name: values.name }),
        concurrency,
        log,
        handler: async (task, ctx) => {
          status.start(task);
          try {
            const result = await runTask(command, task, ctx);
            status.end(task, "done", true);
            return result;
          } catch (error) {
            status.end(task, ctx.signal.aborted ? "stopped" : "failed", false);
            throw error;
          }
        },
      };
      const worker =
        values.listen === undefined ? createWorker(common) : pushWorker(common, values);
      try {
        await worker.done;
      } finally {
        status.close();
      }
      return 0;
    },
    { unauthenticatedHint: "check --token or $MESHWORK_TOKEN: a worker token" },
  );
}
