import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { postgresPlace } from "../../src/db/postgres-url.js";
import { until } from "../support/bounded.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { freePort, spawnServe } from "../support/serve.js";

/**
 * What `meshwork serve` prints while it starts: a line per step and, for a
 * person, a summary that says where everything is and what to try next;
 * JSON lines for a machine.
 */

/** until(), and on a timeout the output so far, to see why. */
async function waitFor(
  check: () => boolean | Promise<boolean>,
  ms: number,
  output: () => string,
): Promise<void> {
  await until(check, ms).catch((error: unknown) => {
    throw new Error(`${String(error)}; output:\n${output()}`);
  });
}

function serveEnv(databaseUrl?: string): NodeJS.ProcessEnv {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  delete env.MESHWORK_LOG_FORMAT;
  if (databaseUrl) env.DATABASE_URL = databaseUrl;
  return env;
}

/**
 * Starts `meshwork serve` on a fresh data dir, waits for the summary (or the
 * listening line), runs `body` while it serves, then stops it.
 */
async function whileServing<T>(
  args: string[],
  databaseUrl: string | undefined,
  body: (s: { output: string; dataDir: string; url: string }) => Promise<T>,
): Promise<T> {
  const port = await freePort();
  const dataDir = join(mkdtempSync(join(tmpdir(), "meshwork-startup-out-")), "data");
  const url = `http://127.0.0.1:${port}`;
  const server = spawnServe(
    ["--listen", `127.0.0.1:${port}`, "--data-dir", dataDir, ...args],
    serveEnv(databaseUrl),
  );
  try {
    await waitFor(
      () => /Stop with Ctrl-C|meshwork listening/.test(server.output()),
      60_000,
      server.output,
    );
    return await body({ output: server.output(), dataDir, url });
  } finally {
    server.child.kill("SIGTERM");
    await server.exited;
  }
}

/** whileServing with nothing to do but read what it printed. */
function startAndStop(args: string[], databaseUrl?: string) {
  return whileServing(args, databaseUrl, async (s) => s);
}

describe("start-up output", () => {
  let database: TestDatabase | undefined;

  beforeAll(async () => {
    if (onPostgres) database = await createTestDatabase();
  });
  afterAll(async () => {
    await database?.drop();
  });

  it("--log-format pretty: a line per step, then where everything is and what to try, no JSON", async () => {
    const { output, dataDir, url } = await startAndStop(["--log-format", "pretty"]);
    const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
    // Each step said as it begins, in order.
    const steps = [
      "creating the embedded database",
      "opening the embedded database",
      "applying database migrations",
    ].map((s) => output.indexOf(s));
    expect(steps.every((i) => i >= 0)).toBe(true);
    expect([...steps].sort((a, b) => a - b)).toEqual(steps);
    expect(output).toContain(`Meshwork is ready at ${url}`);
    expect(output).toContain(`Dashboard     ${url}/`);
    expect(output).toContain(`Database      embedded (PGlite) in ${dataDir}/db`);
    expect(output).toContain(`Admin token   ${join(dataDir, "admin.token")}`);
    expect(output).toContain(`--data-dir ${dataDir} --role worker`);
    // People read it: no JSON object lines, and never the token itself.
    expect(output).not.toMatch(/^\{"level"/m);
    expect(output).not.toContain(token);
  });

  it("the commands the summary suggests work as printed: its curl creates a task, its worker runs it", async () => {
    await whileServing(["--log-format", "pretty"], undefined, async ({ output, dataDir, url }) => {
      let shell: ReturnType<typeof spawn> | undefined;
      try {
        const lines = output.split("\n");
        const from = lines.findIndex((l) => l.trim() === "Try:");
        const to = lines.findIndex((l, i) => i > from && l.trim() === "");
        const script = lines
          .slice(from + 1, to)
          .map((l) => l.trim())
          .join("\n");
        expect(script).toContain("npx meshwork work");
        // Run as a user would paste it, in a shell that already holds another
        // token: the token the summary makes must not depend on it.
        shell = spawn("bash", ["-c", script], {
          env: { ...serveEnv(), MESHWORK_TOKEN: "mw_not_a_token" },
          stdio: ["ignore", "pipe", "pipe"],
          detached: true,
        });
        let out = "";
        shell.stdout?.on("data", (d: Buffer) => {
          out += d.toString();
        });
        shell.stderr?.on("data", (d: Buffer) => {
          out += d.toString();
        });
        await waitFor(
          () => out.includes('"task"'),
          60_000,
          () => out,
        );
        const taskId = (
          JSON.parse(out.slice(out.indexOf("{"), out.indexOf("}}") + 2)) as {
            task: { taskId: string };
          }
        ).task.taskId;
        const admin = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
        const state = async () => {
          const r = await fetch(`${url}/meshwork.v1.TaskService/GetTask`, {
            method: "POST",
            headers: { authorization: `Bearer ${admin}`, "content-type": "application/json" },
            body: JSON.stringify({ taskId }),
          });
          return ((await r.json()) as { task?: { state?: string } }).task?.state;
        };
        let last: string | undefined;
        await waitFor(
          async () => {
            last = await state();
            return last === "TASK_STATE_SUCCEEDED";
          },
          90_000,
          () => `task ${taskId} is ${last}; the commands printed:\n${out}`,
        );
      } finally {
        if (shell?.pid) process.kill(-shell.pid, "SIGTERM");
      }
    });
  });

  it("with --auth off, the suggested worker needs no token of its own", async () => {
    const { output } = await startAndStop(["--log-format", "pretty", "--auth", "off"]);
    expect(output).toContain("export MESHWORK_TOKEN=unused");
    expect(output).not.toContain("token create");
    expect(output).toContain("Auth          off");
  });

  it("by default, when stdout is not a terminal, every line is JSON, the steps included", async () => {
    const { output, url } = await startAndStop([]);
    const lines = output.trim().split("\n");
    const parsed = lines.map((l) => JSON.parse(l) as { msg: string; url?: string });
    expect(parsed.map((l) => l.msg)).toEqual(
      expect.arrayContaining([
        expect.stringContaining("creating the embedded database"),
        "applying database migrations",
        "meshwork listening",
      ]),
    );
    expect(parsed.find((l) => l.msg === "meshwork listening")?.url).toBe(url);
    expect(output).not.toContain("Meshwork is ready");
  });

  it.skipIf(!existsSync("/usr/bin/script"))(
    "on a terminal, by default, the summary (script(1) gives the process a tty)",
    async () => {
      const port = await freePort();
      const dataDir = join(mkdtempSync(join(tmpdir(), "meshwork-startup-out-")), "data");
      const command = `node bin/meshwork.js serve --listen 127.0.0.1:${port} --data-dir ${dataDir}`;
      const child = spawn("script", ["-qfec", command, "/dev/null"], {
        env: serveEnv(),
        stdio: ["pipe", "pipe", "pipe"],
        detached: true,
      });
      let output = "";
      child.stdout.on("data", (d: Buffer) => {
        output += d.toString();
      });
      const exited = new Promise((resolve) => child.on("exit", resolve));
      try {
        await waitFor(
          () => output.includes("Stop with Ctrl-C"),
          60_000,
          () => output,
        );
        expect(output).toContain(`Meshwork is ready at http://127.0.0.1:${port}`);
        expect(output).not.toMatch(/\{"level"/);
      } finally {
        if (child.pid) process.kill(-child.pid, "SIGTERM");
        await exited;
      }
    },
  );

  it.skipIf(!onPostgres)("on PostgreSQL: says where, without the user's password", async () => {
    const url = new URL(database?.url ?? "");
    url.password = "secretpw"; // trust authentication ignores it
    const { output } = await startAndStop(["--log-format", "pretty"], url.toString());
    // host:port/database, or a Unix socket's path and the database (db/postgres-url.ts).
    const place = postgresPlace(url.toString());
    expect(output).toContain(`connecting to PostgreSQL at ${place}`);
    expect(output).toContain(`Database      PostgreSQL at ${place}`);
    expect(output).not.toContain("secretpw");
  });
});
