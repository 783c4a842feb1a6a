import { type ChildProcess, execFile, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../src/config.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { useListeningServer } from "../support/server.js";

const run = promisify(execFile);

describe("--auth", () => {
  it("is on by default, and off is refused on any address but loopback", () => {
    expect(loadConfig([], {}).auth).toBe("on");
    expect(loadConfig(["--listen", "0.0.0.0:8080"], {}).auth).toBe("on");
    expect(loadConfig(["--auth", "off"], {}).auth).toBe("off");
    expect(loadConfig(["--auth", "off", "--listen", "[::1]:8080"], {}).auth).toBe("off");
    for (const listen of ["0.0.0.0:8080", "10.1.2.3:8080", "[::]:8080", "example.org:80"]) {
      expect(() => loadConfig(["--auth", "off", "--listen", listen], {})).toThrow(ConfigError);
      expect(() => loadConfig(["--auth", "off", "--listen", listen], {})).toThrow(/loopback/);
    }
    expect(() => loadConfig([], { MESHWORK_AUTH: "maybe" })).toThrow(/on or off/);
  });
});

// The real `meshwork serve`, as an operator starts it: auth on, on all
// interfaces (tests still talk to it only through 127.0.0.1).
describe("meshwork serve on 0.0.0.0 with auth on", () => {
  let tdb: TestDatabase | undefined;
  let server: ChildProcess;
  let base = "";
  let dataDir = "";
  const log: string[] = [];
  const secrets: string[] = [];

  beforeAll(async () => {
    dataDir = mkdtempSync(join(tmpdir(), "meshwork-auth-"));
    tdb = onPostgres ? await createTestDatabase() : undefined;
    const env = { ...process.env, DATABASE_URL: tdb?.url ?? "", MESHWORK_LOG_LEVEL: "debug" };
    server = spawn(
      "node",
      ["bin/meshwork.js", "serve", "--listen", "0.0.0.0:0", "--data-dir", dataDir],
      { env, stdio: ["ignore", "pipe", "pipe"] },
    );
    const lines = createInterface({ input: server.stdout as NodeJS.ReadableStream });
    base = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`no listening line in: ${log.join("\n")}`)),
        60_000,
      );
      lines.on("line", (line) => {
        log.push(line);
        const entry = JSON.parse(line) as { msg?: string; url?: string };
        if (entry.msg === "meshwork listening" && entry.url) {
          clearTimeout(timer);
          resolve(entry.url.replace("0.0.0.0", "127.0.0.1"));
        }
      });
      server.on("exit", (code) => reject(new Error(`exited ${code}: ${log.join("\n")}`)));
    });
  });
  afterAll(async () => {
    if (server.exitCode === null) {
      server.kill("SIGTERM");
      await new Promise((r) => server.once("exit", r));
    }
    await tdb?.drop();
  });

  const cli = (...args: string[]) =>
    run("node", ["bin/meshwork.js", ...args], {
      env: { ...process.env, MESHWORK_URL: base, MESHWORK_TOKEN: "", MESHWORK_DATA_DIR: dataDir },
    });
  const rpc = async (path: string, token: string, body: unknown) => {
    const res = await fetch(`${base}/${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
      body: JSON.stringify(body),
    });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };

  it("writes the first admin token to <data dir>/admin.token, mode 0600, and logs only its path", () => {
    const file = join(dataDir, "admin.token");
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const admin = readFileSync(file, "utf8").trim();
    expect(admin).toMatch(/^mw_[A-Za-z0-9_-]{43}$/);
    secrets.push(admin);
    expect(log.some((l) => l.includes(file))).toBe(true);
  });

  it("lets the admin make a worker token with the CLI, which a worker then uses through 127.0.0.1", async () => {
    const created = await cli("token", "create", "--role", "worker", "--name", "farm-01");
    const worker = created.stdout.trim();
    expect(worker).toMatch(/^mw_[A-Za-z0-9_-]{43}$/); // the token alone on stdout
    expect(created.stderr).toContain("farm-01");
    secrets.push(worker);
    const registered = await rpc("meshwork.v1.FleetService/RegisterWorker", worker, {
      capabilities: ["render"],
    });
    expect(registered.status).toBe(200);
    const claimed = await rpc("meshwork.v1.LeaseService/ClaimTasks", worker, {
      worker_id: registered.body.workerId,
    });
    expect(claimed).toEqual({ status: 200, body: { freeSlots: 1, maxConcurrency: 1 } });
    // A worker token may not create tasks; no token at all is 401.
    expect(
      (await rpc("meshwork.v1.TaskService/CreateTask", worker, { workload: "render" })).status,
    ).toBe(403);
    const anonymous = await fetch(`${base}/meshwork.v1.TaskService/ListTasks`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(anonymous.status).toBe(401);
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
  });

  it("lists tokens without secrets and revokes by name", async () => {
    const listed = await cli("token", "list", "--json");
    // One document, camelCase as every other command's --json.
    const { tokens: rows } = JSON.parse(listed.stdout) as { tokens: Record<string, unknown>[] };
    expect(rows.map((r) => r.name).sort()).toEqual(["admin", "farm-01"]);
    expect(Object.keys(rows[0] ?? {})).toContain("tokenId");
    for (const s of secrets) expect(listed.stdout).not.toContain(s);
    // The table's columns line up whatever the names' lengths.
    const table = (await cli("token", "list")).stdout.trimEnd().split("\n");
    const at = (line: string) =>
      [...line.matchAll(/(?:^|\s{2,})(\S)/g)].map((m) => (m.index ?? 0) + m[0].length - 1)[2];
    expect(new Set(table.map(at)).size).toBe(1);
    await cli("token", "revoke", "farm-01");
    await new Promise((r) => setTimeout(r, 600)); // past the guard's 500 ms cache
    const worker = secrets[1] ?? "";
    expect((await rpc("meshwork.v1.FleetService/RegisterWorker", worker, {})).status).toBe(401);
  });

  it("never writes a token to its log", async () => {
    await new Promise((r) => setTimeout(r, 200));
    const text = log.join("\n");
    expect(text.length).toBeGreaterThan(0);
    for (const s of secrets) expect(text).not.toContain(s);
    expect(text).not.toMatch(/mw_[A-Za-z0-9_-]{43}/);
  });

  it("stops on SIGTERM with exit code 0 and keeps its tokens across a restart", async () => {
    server.kill("SIGTERM");
    const code = await new Promise((r) => server.once("exit", r));
    expect(code).toBe(0);
    const before = readFileSync(join(dataDir, "admin.token"), "utf8");
    const again = spawn(
      "node",
      ["bin/meshwork.js", "serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir],
      {
        env: { ...process.env, DATABASE_URL: tdb?.url ?? "" },
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    const lines = createInterface({ input: again.stdout as NodeJS.ReadableStream });
    await new Promise<void>((resolve) =>
      lines.on("line", (l) => {
        if (l.includes("meshwork listening")) resolve();
      }),
    );
    again.kill("SIGTERM");
    expect(await new Promise((r) => again.once("exit", r))).toBe(0);
    expect(readFileSync(join(dataDir, "admin.token"), "utf8")).toBe(before);
  });
});

describe("the byte routes under auth", () => {
  const server = useListeningServer({ auth: "on" });
  const call = (path: string, token: string, init: RequestInit = {}) =>
    fetch(`${server.url}${path}`, {
      ...init,
      headers: { ...(init.headers as Record<string, string>), authorization: `Bearer ${token}` },
    });
  const rpc = async (path: string, token: string, body: unknown) =>
    (await (
      await call(`/${path}`, token, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      })
    ).json()) as Record<string, unknown>;
  const makeToken = async (role: string) =>
    (
      (await rpc("meshwork.v1.TokenService/CreateToken", server.adminToken, {
        name: `${role}-${Math.random().toString(36).slice(2)}`,
        role: `TOKEN_ROLE_${role.toUpperCase()}`,
      })) as { secret: string }
    ).secret;

  it("uploads only as the worker that holds the lease; downloads need any valid token", async () => {
    const [worker, other, client] = [
      await makeToken("worker"),
      await makeToken("worker"),
      await makeToken("client"),
    ];
    const workload = `bytes-${Math.random().toString(36).slice(2)}`;
    const { workerId } = (await rpc("meshwork.v1.FleetService/RegisterWorker", worker, {
      capabilities: [workload],
    })) as { workerId: string };
    await rpc("meshwork.v1.TaskService/CreateTask", client, { workload });
    const { claims } = (await rpc("meshwork.v1.LeaseService/ClaimTasks", worker, {
      worker_id: workerId,
    })) as { claims: { taskId: string }[] };
    const taskId = claims[0]?.taskId ?? "";
    const put = (token: string) =>
      call(`/tasks/${taskId}/artifacts/out.txt`, token, {
        method: "PUT",
        headers: { "x-worker-id": workerId, "x-task-attempt": "1", "content-type": "text/plain" },
        body: "hello",
      });
    const anonymous = await fetch(`${server.url}/tasks/${taskId}/artifacts/out.txt`, {
      method: "PUT",
      body: "hello",
    });
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get("www-authenticate")).toContain("Bearer");
    expect(await anonymous.json()).toMatchObject({ error: "unauthenticated" });
    expect((await put(client)).status).toBe(403);
    const foreign = await put(other);
    expect(foreign.status).toBe(403);
    expect(await foreign.json()).toMatchObject({ error: "permission_denied" });
    const listed = await rpc("meshwork.v1.ArtifactService/ListArtifacts", server.adminToken, {
      task_id: taskId,
    });
    expect(listed.artifacts ?? []).toEqual([]); // nothing was stored by the refused uploads
    const stored = await put(worker);
    expect(stored.status).toBe(201);
    const { artifact_id } = (await stored.json()) as { artifact_id: string };
    expect(await (await call(`/artifacts/${artifact_id}/download`, client)).text()).toBe("hello");
    expect((await call(`/artifacts/${artifact_id}/download`, worker)).status).toBe(200);
    expect((await fetch(`${server.url}/artifacts/${artifact_id}/download`)).status).toBe(401);
  });

  it("answers an upload naming a worker id that is not a UUID with 400, not 500", async () => {
    const worker = await makeToken("worker");
    const res = await call(
      `/tasks/${"0".repeat(8)}-0000-4000-8000-${"0".repeat(12)}/artifacts/a`,
      worker,
      {
        method: "PUT",
        headers: { "x-worker-id": "not-a-uuid", "x-task-attempt": "1" },
        body: "x",
      },
    );
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ error: "invalid_argument" });
  });
});
