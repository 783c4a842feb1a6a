import type { ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectPostgres } from "../../src/db/postgres-client.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { freePort, spawnServe, untilReady } from "../support/serve.js";

/**
 * A real coordinator whose statements fail (a trigger that raises on every
 * write of a task, then its connections terminated) while clients send it
 * every kind of secret: the admin token, a worker token, lease tokens, a
 * bad bearer token and users' payloads. Its whole log output must hold none
 * of them, nor any SQL text or parameters, while still saying what failed:
 * the error class, the SQLSTATE and the statement's name.
 */
describe.skipIf(!onPostgres)("logs of a run with failing statements", () => {
  let tdb: TestDatabase;
  let child: ChildProcess;
  let url: string;
  let adminToken: string;
  let output: () => string = () => "";

  beforeAll(async () => {
    tdb = await createTestDatabase();
    const port = await freePort();
    url = `http://127.0.0.1:${port}`;
    const dataDir = mkdtempSync(join(tmpdir(), "meshwork-logs-"));
    const served = spawnServe(["--listen", `127.0.0.1:${port}`, "--data-dir", dataDir], {
      ...process.env,
      DATABASE_URL: tdb.url,
    });
    child = served.child;
    output = served.output;
    await untilReady(url, 60_000);
    adminToken = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
  });

  afterAll(async () => {
    child?.kill("SIGKILL");
    await tdb?.drop();
  });

  const rpc = async (method: string, token: string, body: unknown) => {
    const res = await fetch(`${url}/meshwork.v1.${method}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
    });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };

  it("never holds a token, a payload or SQL, and says what failed", async () => {
    const secrets: string[] = [adminToken];
    const made = await rpc("TokenService/CreateToken", adminToken, {
      name: "log-test-worker",
      role: "TOKEN_ROLE_WORKER",
    });
    expect(made.status).toBe(200);
    const workerToken = String(made.body.secret);
    secrets.push(workerToken);
    const reg = await rpc("FleetService/RegisterWorker", workerToken, {
      capabilities: ["logs"],
      maxConcurrency: 10,
    });
    const workerId = String(reg.body.workerId);
    const payload = `payload-${crypto.randomUUID()}`;
    secrets.push(payload);
    const created = await rpc("TaskService/CreateTasks", adminToken, {
      tasks: Array.from({ length: 4 }, () => ({
        workload: "logs",
        requiredCapabilities: ["logs"],
        parameters: { secret: payload },
      })),
    });
    expect(created.status).toBe(200);
    const claimed = await rpc("LeaseService/ClaimTasks", workerToken, {
      workerId,
      maxTasks: 4,
    });
    const claims = (
      claimed.body.claims as { taskId: string; attempt: number; leaseToken: string }[]
    ).map(({ taskId, attempt, leaseToken }) => ({ taskId, attempt, leaseToken }));
    expect(claims).toHaveLength(4);
    secrets.push(...claims.map((c) => c.leaseToken));

    // Every write of a task now fails inside the database.
    const admin = connectPostgres(tdb.url ?? "", { max: 1, onnotice: () => {} });
    await admin.unsafe(`create function fail_writes() returns trigger language plpgsql as $$
      begin raise exception 'writes refused by the test'; end $$`);
    await admin.unsafe(`create trigger fail_writes before insert or update on tasks
      for each row execute function fail_writes()`);

    const refusedPayload = `refused-${crypto.randomUUID()}`;
    secrets.push(refusedPayload);
    const [first, second, third, fourth] = claims;
    const statuses = [
      await rpc("LeaseService/CompleteTask", workerToken, {
        ...first,
        workerId,
        resultSummary: refusedPayload,
      }),
      await rpc("LeaseService/RenewLease", workerToken, { ...second, workerId }),
      await rpc("LeaseService/FailTask", workerToken, {
        ...third,
        workerId,
        errorCode: "E",
        errorMessage: refusedPayload,
      }),
      await rpc("TaskService/CreateTask", adminToken, {
        workload: "logs",
        parameters: { secret: refusedPayload },
      }),
    ].map((r) => r.status);
    expect(statuses).toEqual([500, 500, 500, 500]);
    // A bearer token that is no token: refused, and not written down.
    const bogus = `mw_${"0".repeat(8)}_${crypto.randomUUID().replaceAll("-", "")}`;
    secrets.push(bogus);
    expect((await rpc("FleetService/GetFleetStatus", bogus, {})).status).toBe(401);

    // Connections terminated under calls that carry a lease token.
    await admin.unsafe("drop trigger fail_writes on tasks");
    const name = new URL(tdb.url ?? "").pathname.slice(1);
    const calls = Array.from({ length: 40 }, (_, i) =>
      rpc("LeaseService/RenewLease", workerToken, { ...fourth, workerId }).catch(() => ({
        status: i,
      })),
    );
    for (let i = 0; i < 5; i++) {
      await admin`select pg_terminate_backend(pid) from pg_stat_activity
        where datname = ${name} and pid <> pg_backend_pid()`;
    }
    await Promise.all(calls);
    await admin.end();
    await new Promise((r) => setTimeout(r, 300));

    const lines = output()
      .split("\n")
      .filter((l) => l !== "");
    const failures = lines.filter((l) => l.includes('"rpc failed'));
    expect(failures.length).toBeGreaterThanOrEqual(4);
    // What failed is said: the error class, the SQLSTATE, the statement.
    const raised = failures.filter((l) => l.includes('"sqlstate":"P0001"'));
    expect(raised.length).toBeGreaterThanOrEqual(4);
    for (const line of raised) {
      expect(JSON.parse(line).err).toMatchObject({
        type: expect.any(String),
        statement: expect.stringMatching(/^(update|insert into|select) /),
      });
    }
    for (const secret of secrets) {
      const leaked = lines.find((l) => l.includes(secret));
      expect(leaked, `a secret is in the log: ${leaked?.slice(0, 300)}`).toBeUndefined();
    }
    for (const line of lines) {
      expect(line).not.toMatch(/params:|"params"|"query"|\$1/);
      expect(line.length).toBeLessThan(4000);
    }
  });
});
