import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { onPostgres } from "../support/database.js";
import { freePort, spawnServe } from "../support/serve.js";

/**
 * One data directory, one coordinator: a second `serve` on the same
 * directory refuses to start (it would see only its own writes of the
 * embedded database, and lose the other's), and a `serve` that cannot bind
 * its port touches nothing. Both run on the embedded database.
 */

const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) c.kill("SIGKILL");
});

function start(dataDir: string, port: number) {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  const served = spawnServe(["--listen", `127.0.0.1:${port}`, "--data-dir", dataDir], env);
  children.push(served.child);
  return { ...served, url: `http://127.0.0.1:${port}` };
}

async function ready(url: string): Promise<void> {
  const deadline = Date.now() + 90_000;
  while (Date.now() < deadline) {
    const status = await fetch(`${url}/readyz`).then(
      (r) => r.status,
      () => 0,
    );
    if (status === 200) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`${url} did not become ready`);
}

// The embedded database needs no server: this runs once, in the PGlite run.
describe.skipIf(onPostgres)("one coordinator per data directory", () => {
  it("refuses a second serve on the same data directory, and the first keeps every write", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-lock-"));
    const first = start(dir, await freePort());
    await ready(first.url);
    const token = readFileSync(join(dir, "admin.token"), "utf8").trim();
    const create = (url: string, name: string) =>
      fetch(`${url}/meshwork.v1.TaskService/CreateTask`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
        body: JSON.stringify({ workload: "lock-test", name }),
      });
    expect((await create(first.url, "before")).status).toBe(200);
    // An upload in flight on the first while the second tries to start.
    const rpc = async (method: string, body: unknown) =>
      (await (
        await fetch(`${first.url}/meshwork.v1.${method}`, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
          body: JSON.stringify(body),
        })
      ).json()) as Record<string, unknown>;
    const workerId = String(
      (await rpc("FleetService/RegisterWorker", { capabilities: ["upload"] })).workerId,
    );
    await rpc("TaskService/CreateTask", { workload: "upload" });
    const { claims } = await rpc("LeaseService/ClaimTasks", { workerId });
    const claim = (claims as { taskId: string; attempt: number }[])[0];
    let send: ((chunk: Uint8Array | null) => void) | undefined;
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        send = (chunk) => (chunk ? controller.enqueue(chunk) : controller.close());
      },
    });
    const upload = fetch(`${first.url}/tasks/${claim?.taskId}/artifacts/out.bin`, {
      method: "PUT",
      headers: {
        authorization: `Bearer ${token}`,
        "x-worker-id": workerId,
        "x-task-attempt": String(claim?.attempt),
      },
      body,
      duplex: "half",
    } as RequestInit);
    send?.(new Uint8Array(100_000).fill(1));

    const second = start(dir, await freePort());
    expect(await second.exited).toBe(1);
    expect(second.output()).toContain(
      `the data directory ${dir} is in use by another meshwork process (pid ${first.child.pid}`,
    );
    expect(second.output()).not.toMatch(/\n\s+at /); // one line, no stack

    send?.(new Uint8Array(100_000).fill(2));
    send?.(null);
    expect((await upload).status).toBe(201); // its temporary file was left alone
    expect((await create(first.url, "after")).status).toBe(200);
    first.child.kill("SIGTERM");
    expect(await first.exited).toBe(0);
    expect(existsSync(join(dir, "meshwork.lock"))).toBe(false);

    // Restarted on the same directory: both tasks are there.
    const again = start(dir, await freePort());
    await ready(again.url);
    const listed = await fetch(`${again.url}/meshwork.v1.TaskService/ListTasks`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
      body: JSON.stringify({ workload: "lock-test" }),
    });
    const { tasks } = (await listed.json()) as { tasks: { name: string }[] };
    expect(tasks.map((t) => t.name).sort()).toEqual(["after", "before"]);
    again.child.kill("SIGTERM");
    expect(await again.exited).toBe(0);
  });

  it("takes over a lock left by a process that is gone", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-lock-"));
    const gone = spawn("node", ["-e", ""]);
    const pid = gone.pid ?? 0;
    await new Promise((r) => gone.on("exit", r));
    writeFileSync(join(dir, "meshwork.lock"), `${pid}\n`);
    const server = start(dir, await freePort());
    await ready(server.url);
    expect(readFileSync(join(dir, "meshwork.lock"), "utf8").trim()).toBe(String(server.child.pid));
    server.child.kill("SIGTERM");
    expect(await server.exited).toBe(0);
  });

  it("touches nothing in its data directory when it cannot bind its port", async () => {
    const blocker = createServer();
    const port = await new Promise<number>((resolve) =>
      blocker.listen(0, "127.0.0.1", () => resolve((blocker.address() as { port: number }).port)),
    );
    const dir = mkdtempSync(join(tmpdir(), "meshwork-bind-"));
    const server = start(dir, port);
    expect(await server.exited).toBe(1);
    blocker.close();
    expect(server.output()).toContain("cannot listen");
    expect(readdirSync(dir)).toEqual([]); // no database, no blobs, no token, no lock
  });
});
