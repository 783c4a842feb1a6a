import { randomUUID } from "node:crypto";
import { type Client, createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ArtifactKind, ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import type { App } from "../../src/app.js";
import { transportFor } from "../../src/cli/connect.js";
import { listen, type RunningServer } from "../../src/server.js";
import { until } from "../support/bounded.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { expireLease } from "../support/fixtures.js";
import { appOn, uniqueWorkload } from "../support/harness.js";
import { useListeningServer } from "../support/server.js";

/** One sample line of the Prometheus text format. */
interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The samples of a scrape (comment lines skipped). */
function parse(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[l[1] ?? ""] = (l[2] ?? "").replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));
    }
    samples.push({ name: m[1] ?? "", labels, value: Number(m[3]) });
  }
  return samples;
}

/** The sum of the samples named `name` whose labels include `labels` (0 when none). */
function sum(samples: Sample[], name: string, labels: Record<string, string> = {}): number {
  return samples
    .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((total, s) => total + s.value, 0);
}

function has(samples: Sample[], name: string, labels: Record<string, string> = {}): boolean {
  return samples.some(
    (s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v),
  );
}

async function scrape(url: string, token?: string): Promise<Response> {
  return fetch(`${url}/metrics`, {
    headers: token ? { authorization: `Bearer ${token}` } : {},
  });
}

describe("GET /metrics after a drain", () => {
  let tdb: TestDatabase;
  let app: App;
  let server: RunningServer;
  let clientToken = "";
  let workerToken = "";
  const client = <S extends Parameters<typeof createClient>[0]>(service: S, token: string) =>
    createClient(service, transportFor({ url: server.url, token })) as Client<S>;
  const read = async () => {
    const res = await scrape(server.url, clientToken);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await res.text();
    return { text, samples: parse(text) };
  };

  beforeAll(async () => {
    tdb = await createTestDatabase();
    app = appOn(tdb.database, { auth: "on" });
    clientToken = (await app.tokens.create("metrics-client", "client")).secret;
    workerToken = (await app.tokens.create("metrics-worker", "worker")).secret;
    server = await listen(app, "127.0.0.1:0");
  });
  afterAll(async () => {
    await server.close();
    await tdb.drop();
  });

  it("counts tasks, claims, completions, failures, expiries, bytes and RPCs by the right amounts", async () => {
    const workload = uniqueWorkload("metrics");
    const secretValue = `payload-${randomUUID()}`;
    const tasks = client(TaskService, clientToken);
    const fleet = client(FleetService, workerToken);
    const leases = client(LeaseService, workerToken);
    const artifacts = client(ArtifactService, workerToken);
    const before = (await read()).samples;

    const n = 5;
    await tasks.createTasks({
      tasks: Array.from({ length: n - 1 }, (_, i) => ({
        name: `t${i}`,
        workload,
        parameters: { secret: secretValue },
      })),
    });
    await tasks.createTask({ name: "last", workload, maxAttempts: 1 });
    // An idempotent repeat answers with the task made before: not a new task.
    await tasks.createTask({ name: "once", workload, idempotencyKey: `k-${workload}` });
    await tasks.createTask({ name: "once", workload, idempotencyKey: `k-${workload}` });
    const { workerId } = await fleet.registerWorker({
      name: "metrics-worker",
      capabilities: [workload],
      maxConcurrency: 100,
    });
    const { claims } = await leases.claimTasks({ workerId, maxTasks: 10 });
    expect(claims).toHaveLength(n + 1);
    const [uploading, ...rest] = claims;
    if (!uploading) throw new Error("nothing claimed");

    // An upload of k bytes, then downloads over RPC (one full 256 KiB
    // message and a short one) and over HTTP.
    const k = 300_000;
    const body = new Uint8Array(k).fill(7);
    const { artifact } = await artifacts.uploadArtifact(
      (async function* () {
        yield {
          payload: {
            case: "header" as const,
            value: {
              taskId: uploading.taskId,
              workerId,
              attempt: uploading.attempt,
              leaseToken: uploading.leaseToken,
              filename: "out.bin",
              kind: ArtifactKind.OUTPUT,
            },
          },
        };
        yield { payload: { case: "chunk" as const, value: body } };
      })(),
    );
    const artifactId = artifact?.artifactId ?? "";
    let downloaded = 0;
    for await (const m of artifacts.downloadArtifact({ artifactId })) {
      downloaded += m.chunk.byteLength;
    }
    expect(downloaded).toBe(k);
    const http = await fetch(`${server.url}/artifacts/${artifactId}/download`, {
      headers: { authorization: `Bearer ${workerToken}` },
    });
    expect((await http.arrayBuffer()).byteLength).toBe(k);

    // Four completions (one alone, three together), one failure, one lease expired.
    const lease = (c: (typeof claims)[number]) => ({
      taskId: c.taskId,
      workerId,
      attempt: c.attempt,
      leaseToken: c.leaseToken,
    });
    const [failing, expiring, ...completing] = rest;
    if (!failing || !expiring) throw new Error("too few claims");
    await leases.completeTask(lease(uploading));
    // The first of the batch twice, then the lone one again: identical repeats, accepted again.
    const [twice] = completing;
    if (!twice) throw new Error("too few claims");
    await leases.completeTasks({ completions: [...completing, twice].map(lease) });
    await leases.completeTask(lease(uploading));
    await leases.failTask({ ...lease(failing), errorCode: "E", retryable: false });
    await expireLease(app.database.db, expiring.taskId);
    await app.sweeper.runOnce();
    // A refused call: a task that does not exist.
    expect(await outcome(tasks.getTask({ taskId: randomUUID() }))).toMatchObject({
      code: "NotFound",
    });

    const { text, samples: after } = await read();
    const delta = (name: string, labels: Record<string, string> = {}) =>
      sum(after, name, labels) - sum(before, name, labels);
    expect(delta("meshwork_tasks_created_total", { workload })).toBe(n + 1);
    expect(delta("meshwork_claims_total", { workload })).toBe(n + 1);
    // Each task's completion counts once, its repeats apart (never a double count).
    expect(delta("meshwork_completions_total", { workload })).toBe(1 + completing.length);
    expect(delta("meshwork_completion_repeats_total", { workload })).toBe(2);
    expect(delta("meshwork_failures_total", { workload, outcome: "failed" })).toBe(1);
    expect(delta("meshwork_failures_total", { workload, outcome: "retry" })).toBe(0);
    expect(delta("meshwork_lease_expiries_total", { outcome: "retry" })).toBe(1);
    expect(delta("meshwork_sweeper_runs_total", { result: "ok" })).toBeGreaterThanOrEqual(1);
    expect(delta("meshwork_artifact_bytes_in_total")).toBe(k);
    expect(delta("meshwork_artifact_bytes_out_total")).toBe(2 * k);

    const rpc = (service: string, method: string, code: string) =>
      delta("meshwork_rpc_requests_total", { service, method, code });
    expect(rpc("meshwork.v1.TaskService", "CreateTasks", "ok")).toBe(1);
    expect(rpc("meshwork.v1.TaskService", "CreateTask", "ok")).toBe(3);
    expect(rpc("meshwork.v1.LeaseService", "ClaimTasks", "ok")).toBe(1);
    expect(rpc("meshwork.v1.LeaseService", "CompleteTask", "ok")).toBe(2);
    expect(rpc("meshwork.v1.LeaseService", "CompleteTasks", "ok")).toBe(1);
    expect(rpc("meshwork.v1.LeaseService", "FailTask", "ok")).toBe(1);
    expect(rpc("meshwork.v1.ArtifactService", "UploadArtifact", "ok")).toBe(1);
    expect(rpc("meshwork.v1.ArtifactService", "DownloadArtifact", "ok")).toBe(1);
    expect(rpc("meshwork.v1.TaskService", "GetTask", "not_found")).toBe(1);
    expect(
      delta("meshwork_rpc_duration_seconds_count", {
        service: "meshwork.v1.LeaseService",
        method: "ClaimTasks",
        code: "ok",
      }),
    ).toBe(1);
    expect(
      has(after, "meshwork_rpc_duration_seconds_bucket", {
        method: "ClaimTasks",
        code: "ok",
        le: "+Inf",
      }),
    ).toBe(true);
    expect(
      delta("meshwork_http_requests_total", {
        route: "download an artifact",
        method: "GET",
        status: "200",
      }),
    ).toBe(1);
    expect(delta("meshwork_http_requests_total", { route: "read metrics", status: "200" })).toBe(1);

    // Statements by name, never their text or parameters.
    expect(
      sum(after, "meshwork_db_statement_duration_seconds_count", {
        statement: "select meshwork_claim_batch",
      }),
    ).toBeGreaterThan(0);
    expect(sum(after, "meshwork_db_pool_connections", { state: "size" })).toBeGreaterThan(0);
    expect(has(after, "process_cpu_user_seconds_total")).toBe(true);
    for (const secret of [
      secretValue,
      uploading.leaseToken,
      failing.leaseToken,
      workerToken,
      clientToken,
      "$1",
      "returning",
      "jsonb_to_recordset",
    ]) {
      expect(text).not.toContain(secret);
    }

    // The task gauges are read at scrape time (cached 2 s): the one task
    // whose lease expired is PENDING again, the others are finished.
    await until(async () => {
      const now = (await read()).samples;
      return (
        sum(now, "meshwork_tasks", { workload, state: "PENDING" }) === 1 &&
        !has(now, "meshwork_tasks", { workload, state: "ASSIGNED" })
      );
    }, 10_000);
    const last = (await read()).samples;
    expect(
      sum(last, "meshwork_backlog_oldest_pending_seconds", { workload }),
    ).toBeGreaterThanOrEqual(0);
    expect(has(last, "meshwork_backlog_oldest_pending_seconds", { workload })).toBe(true);
  });

  it("counts a stream its client left as canceled", async () => {
    const tasks = client(TaskService, clientToken);
    const { task } = await tasks.createTask({ name: "watched", workload: uniqueWorkload() });
    const canceled = async () =>
      sum((await read()).samples, "meshwork_rpc_requests_total", {
        method: "WatchTask",
        code: "canceled",
      });
    const before = await canceled();
    const leaving = new AbortController();
    const watch = tasks.watchTask({ taskId: task?.taskId ?? "" }, { signal: leaving.signal });
    await outcome(
      (async () => {
        for await (const _ of watch) leaving.abort();
      })(),
    );
    await until(async () => (await canceled()) === before + 1, 10_000);
    expect(
      sum((await read()).samples, "meshwork_rpc_requests_total", {
        method: "WatchTask",
        code: "ok",
      }),
    ).toBe(0);
  });

  it("asks for a token of role client or admin", async () => {
    const none = await scrape(server.url);
    expect(none.status).toBe(401);
    const worker = await scrape(server.url, workerToken);
    expect(worker.status).toBe(403);
    expect(await worker.json()).toMatchObject({ error: "permission_denied" });
    expect((await scrape(server.url, clientToken)).status).toBe(200);
  });
});

describe("GET /metrics with --metrics-public on", () => {
  const server = useListeningServer({ auth: "on", metricsPublic: true });

  it("answers without a token", async () => {
    const res = await scrape(server.url);
    expect(res.status).toBe(200);
    expect(await res.text()).toContain("meshwork_rpc_requests_total");
  });
});
