import { type ChildProcess, execFile, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { within } from "../support/bounded.js";

// The package as a user gets it: `npm pack`, installed into an empty folder,
// run with npx, its gen/ subpath imported with its type declarations. Slow
// (npm install fetches the dependencies), so it runs only when asked:
// MESHWORK_TEST_PACKAGE=1 (CI's "package" step).
const enabled = process.env.MESHWORK_TEST_PACKAGE === "1";

const run = promisify(execFile);
const root = resolve(import.meta.dirname, "../..");
const version = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).version as string;

/** process.env without npm's npm_* variables: `npm test` sets them, and npm reads them as config. */
function cleanEnv(): NodeJS.ProcessEnv {
  return Object.fromEntries(
    Object.entries(process.env).filter(([key]) => !key.toLowerCase().startsWith("npm_")),
  );
}

describe.skipIf(!enabled)("the npm package", () => {
  const dir = enabled ? mkdtempSync(join(tmpdir(), "meshwork-package-")) : "";
  let app = "";
  // The installed dependencies take some 100 MB.
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  beforeAll(async () => {
    // The global setup has just built dist/: pack it without building again
    // (prepack would rebuild it under test files running in parallel).
    const { stdout } = await run(
      "npm",
      ["pack", "--ignore-scripts", "--json", "--pack-destination", dir],
      { cwd: root, env: cleanEnv(), timeout: 120_000 },
    );
    const [{ filename }] = JSON.parse(stdout) as [{ filename: string }];
    app = join(dir, "app");
    mkdirSync(app);
    writeFileSync(join(app, "package.json"), '{ "private": true, "type": "module" }\n');
    await run(
      "npm",
      ["install", join(dir, filename), "--prefer-offline", "--no-audit", "--no-fund"],
      { cwd: app, env: cleanEnv(), timeout: 240_000 },
    );
  }, 300_000);

  it("installs a bin that npx runs: --version is the one in package.json", async () => {
    const { stdout } = await run("npx", ["--no", "--", "meshwork", "--version"], {
      cwd: app,
      env: cleanEnv(),
      timeout: 60_000,
    });
    expect(stdout).toBe(`meshwork ${version}\n`);
    // The worker runner is in the package too.
    const work = await run("npx", ["--no", "--", "meshwork", "work", "--help"], {
      cwd: app,
      env: cleanEnv(),
      timeout: 60_000,
    });
    expect(work.stdout).toMatch(/meshwork work[\s\S]*-- COMMAND/);
  });

  it("serves: /readyz answers 200, `npx meshwork work` runs a task on it, and SIGTERM ends the server with exit code 0", async () => {
    const dataDir = join(app, "data");
    // The embedded database, whatever the environment says.
    const env = cleanEnv();
    delete env.DATABASE_URL;
    // The installed bin itself, which is what npx runs: npx does not pass
    // SIGTERM on to it, so its exit code could not be seen through npx.
    const child = spawn(
      join(app, "node_modules/.bin/meshwork"),
      ["serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir],
      { cwd: app, env, stdio: ["ignore", "pipe", "pipe"] },
    );
    let output = "";
    child.stdout.on("data", (d: Buffer) => {
      output += d.toString();
    });
    child.stderr.on("data", (d: Buffer) => {
      output += d.toString();
    });
    const exited = new Promise<number | null>((done) => child.on("exit", (code) => done(code)));
    let work: ChildProcess | undefined;
    try {
      let url = "";
      for (let i = 0; i < 120 && !url; i++) {
        url = /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(output)?.[1] ?? "";
        if (!url) await new Promise((r) => setTimeout(r, 250));
      }
      expect(url, output).not.toBe("");
      const ready = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(10_000) });
      expect(ready.status).toBe(200);

      // A worker token, made with the admin token the first start wrote.
      const admin = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
      const call = async (path: string, body: unknown) => {
        const res = await fetch(`${url}/meshwork.v1.${path}`, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${admin}` },
          body: JSON.stringify(body),
          signal: AbortSignal.timeout(10_000),
        });
        const text = await res.text();
        expect(res.status, text).toBe(200);
        return JSON.parse(text);
      };
      const { secret } = await call("TokenService/CreateToken", {
        name: "pkg",
        role: "TOKEN_ROLE_WORKER",
      });
      expect(secret).toBeTruthy();

      // `meshwork work` through npx, in a process group of its own: npx does
      // not pass SIGTERM on, so the whole group is signalled.
      work = spawn(
        "npx",
        [
          "--no",
          "--",
          "meshwork",
          "work",
          "--url",
          url,
          "--workload",
          "pkgwc",
          "--",
          "sh",
          "-c",
          'wc -l < "$MESHWORK_INPUT" > "$MESHWORK_OUTPUT/count.txt"',
        ],
        { cwd: app, env: { ...cleanEnv(), MESHWORK_TOKEN: secret }, detached: true },
      );
      let workOutput = "";
      work.stdout?.on("data", (d: Buffer) => {
        workOutput += d.toString();
      });
      work.stderr?.on("data", (d: Buffer) => {
        workOutput += d.toString();
      });
      const workExited = new Promise<void>((done) => work?.on("exit", () => done()));

      const { task: created } = await call("TaskService/CreateTask", {
        workload: "pkgwc",
        inputData: Buffer.from("x\ny\n").toString("base64"),
        maxAttempts: 1,
      });
      const taskId = created?.taskId as string;
      expect(taskId).toBeTruthy();
      let task: { state?: string; result?: { uri?: string }; error?: unknown } = {};
      const end = Date.now() + 30_000;
      while (Date.now() < end) {
        ({ task } = await call("TaskService/GetTask", { taskId }));
        if (task.state === "TASK_STATE_SUCCEEDED" || task.state === "TASK_STATE_FAILED") break;
        await new Promise((r) => setTimeout(r, 250));
      }
      expect(task.state, `${JSON.stringify(task)}\n${workOutput}`).toBe("TASK_STATE_SUCCEEDED");
      const result = await fetch(`${url}${new URL(task.result?.uri ?? "").pathname}`, {
        headers: { authorization: `Bearer ${admin}` },
        signal: AbortSignal.timeout(10_000),
      });
      expect(result.status).toBe(200);
      expect((await result.text()).trim()).toBe("2");

      process.kill(-(work.pid ?? 0), "SIGTERM");
      expect(await within(15_000, workExited), workOutput).not.toBe("timed out");

      child.kill("SIGTERM");
      expect(await within(15_000, exited), output).toBe(0);
    } finally {
      // The whole group: npx may be gone while meshwork work is not.
      if (work?.pid) {
        try {
          process.kill(-work.pid, "SIGKILL");
        } catch {
          // Already gone.
        }
      }
      child.kill("SIGKILL");
    }
  }, 120_000);

  it("exposes the generated service descriptors as meshwork/gen/… with type declarations", async () => {
    writeFileSync(
      join(app, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          target: "ES2023",
          module: "NodeNext",
          moduleResolution: "NodeNext",
          strict: true,
          types: ["node"],
          // The worker SDK's declarations name Node's types (AbortSignal,
          // streams): a consumer has @types/node; this one borrows the repository's.
          typeRoots: [join(root, "node_modules/@types")],
          // Connect's own declarations name fetch types (HeadersInit) from
          // the DOM library, as every Connect consumer without it does.
          skipLibCheck: true,
          lib: ["ES2023"],
          outDir: "out",
        },
        files: ["consumer.ts"],
      }),
    );
    writeFileSync(
      join(app, "consumer.ts"),
      `import { create } from "@bufbuild/protobuf";
import { CreateTaskRequestSchema, TaskService, TaskState } from "meshwork/gen/meshwork/v1/task_pb";
import { createWorker, TaskError } from "meshwork/worker";
import { createClient, TaskFailedError } from "meshwork/client";


const request = create(CreateTaskRequestSchema, { name: "demo", workload: "render" });
const state: TaskState = TaskState.PENDING;
// @ts-expect-error: the declarations know CreateTaskRequest's fields.
create(CreateTaskRequestSchema, { nmae: "typo" });
console.log(TaskService.typeName, TaskService.method.createTask.name, request.workload, state);
// The worker SDK, typed (defined, not started).
export function startWorker() {
  return createWorker({
    url: "http://127.0.0.1:8080",
    token: "t",
    workloads: ["wc"],
    concurrency: 2,
    async handler(_task, ctx) {
      if (ctx.signal.aborted) throw new TaskError("Stopped", "stopped", { retryable: false });
      return {};
    },
  });
}
// @ts-expect-error: the declarations know createWorker's options.
export const wrong = () => createWorker({ url: 8080 });
// The client SDK, typed (made, not called).
const client = createClient({ baseUrl: "http://127.0.0.1:8080", token: "t" });
export const render = () => client.tasks.create<{ frame: number }>("render", { frame: 1 });
// @ts-expect-error: the declarations know the parameters' type.
export const wrongFrame = () => client.tasks.create<{ frame: number }>("render", { frame: "1" });
console.log(typeof client.tasks.result, TaskFailedError.name);
`,
    );
    // tsc prints its errors on stdout: keep them in the failure.
    await run(process.execPath, [join(root, "node_modules/typescript/bin/tsc"), "-p", app], {
      cwd: app,
      timeout: 120_000,
    }).catch((error: { message: string; stdout?: string }) => {
      throw new Error(`${error.message}\n${error.stdout ?? ""}`);
    });
    const { stdout } = await run(process.execPath, [join(app, "out/consumer.js")], {
      cwd: app,
      timeout: 30_000,
    });
    expect(stdout).toBe("meshwork.v1.TaskService CreateTask render 1\nfunction TaskFailedError\n");
  }, 150_000);
});
