import { appendFileSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { createApp } from "../../src/app.js";
import { listen } from "../../src/server.js";
import { traceFromHeaders } from "../../src/tracing/context.js";
import { createOtelTracing } from "../../src/tracing/otel.js";
import { within } from "../support/bounded.js";
import { createTestDatabase } from "../support/database.js";
import { testConfig } from "../support/harness.js";
import { freePort, spawnServe, untilReady } from "../support/serve.js";

// Span export (docs/tracing.md): with --otel-endpoint, the coordinator sends
// a server span per RPC, a child of the caller's traceparent, and a client
// span per database statement, over OTLP/HTTP (JSON) to <endpoint>/v1/traces;
// without it, no OpenTelemetry module is loaded at all.

const traceId = "0af7651916cd43dd8448eb211c80319c";
const clientSpan = "b7ad6b7169203331";
const traceparent = `00-${traceId}-${clientSpan}-01`;

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind: number;
  attributes: { key: string; value: { stringValue?: string; intValue?: number | string } }[];
  status?: { code?: number };
  resource: Record<string, string>;
}

/** A fake OpenTelemetry collector: POST /v1/traces, OTLP JSON, its spans gathered. */
async function fakeCollector(): Promise<{ url: string; spans: OtlpSpan[]; server: Server }> {
  const spans: OtlpSpan[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (req.method === "POST" && req.url === "/v1/traces") {
        expect(req.headers["content-type"]).toContain("application/json");
        const body = JSON.parse(Buffer.concat(chunks).toString()) as {
          resourceSpans: {
            resource: { attributes: { key: string; value: { stringValue?: string } }[] };
            scopeSpans: { spans: Omit<OtlpSpan, "resource">[] }[];
          }[];
        };
        for (const rs of body.resourceSpans) {
          const resource = Object.fromEntries(
            rs.resource.attributes.map((a) => [a.key, a.value.stringValue ?? ""]),
          );
          for (const ss of rs.scopeSpans) for (const s of ss.spans) spans.push({ ...s, resource });
        }
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end("{}");
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, spans, server };
}

const attr = (s: OtlpSpan, key: string) => {
  const v = s.attributes.find((a) => a.key === key)?.value;
  return v?.stringValue ?? (v?.intValue === undefined ? undefined : Number(v.intValue));
};

/**
 * A module loaded before the coordinator (node --import) that appends to
 * `file` the URL of every module resolved under @opentelemetry/.
 */
function moduleProbe(dir: string, file: string): string {
  const hooks = join(dir, "hooks.mjs");
  writeFileSync(
    hooks,
    `import { appendFileSync } from "node:fs";
export async function resolve(specifier, context, next) {
  const r = await next(specifier, context);
  if (r.url.includes("/@opentelemetry/")) appendFileSync(${JSON.stringify(file)}, r.url + "\\n");
  return r;
}
`,
  );
  const probe = join(dir, "probe.mjs");
  writeFileSync(
    probe,
    `import { register } from "node:module";
register(${JSON.stringify(pathToFileURL(hooks).href)});
`,
  );
  appendFileSync(file, "");
  return probe;
}

/** Coordinators still running: a test that timed out leaves its own behind. */
const running = new Set<{ kill(signal: NodeJS.Signals): boolean }>();

/**
 * Runs a coordinator (PGlite, auth off), makes one traced CreateTask, stops it
 * with SIGTERM and requires exit code 0. `extraEnv` is added to its
 * environment.
 */
async function runCoordinator(extraArgs: string[], extraEnv: NodeJS.ProcessEnv = {}) {
  const dir = mkdtempSync(join(tmpdir(), "meshwork-otel-"));
  const loaded = join(dir, "loaded.txt");
  const probe = moduleProbe(dir, loaded);
  const env: NodeJS.ProcessEnv = { ...process.env, NODE_OPTIONS: `--import ${probe}` };
  delete env.DATABASE_URL;
  delete env.OTEL_EXPORTER_OTLP_ENDPOINT;
  Object.assign(env, extraEnv);
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const served = spawnServe(
    [
      "--listen",
      `127.0.0.1:${port}`,
      "--data-dir",
      join(dir, "data"),
      "--auth",
      "off",
      ...extraArgs,
    ],
    env,
  );
  running.add(served.child);
  try {
    await untilReady(url, 90_000);
    const res = await fetch(`${url}/meshwork.v1.TaskService/CreateTask`, {
      method: "POST",
      headers: { "content-type": "application/json", traceparent },
      body: JSON.stringify({ workload: "otel" }),
    });
    expect(res.status).toBe(200);
    const { task } = (await res.json()) as { task: { traceparent: string } };
    // A refused call: its span says which code.
    const refused = await fetch(`${url}/meshwork.v1.TaskService/GetTask`, {
      method: "POST",
      headers: { "content-type": "application/json", traceparent },
      body: JSON.stringify({ taskId: "not-a-uuid" }),
    });
    expect(refused.status).toBe(400);
    // A gRPC call: rpc.system says so.
    const grpc = createClient(TaskService, createGrpcTransport({ baseUrl: url }));
    await grpc.listTasks({ pageSize: 1 }, { headers: { traceparent } });
    served.child.kill("SIGTERM");
    // A bound against a hang, not a timing: 4 times the coordinator's 5 s
    // cap on the last export, and short of the batch processor's own 30 s.
    expect(await within(20_000, served.exited)).toBe(0);
    return { task, loaded: readFileSync(loaded, "utf8"), output: served.output() };
  } finally {
    served.child.kill("SIGKILL");
    running.delete(served.child);
  }
}

// Each test starts a coordinator (the last one a database): on a loaded
// machine that alone can take longer than the default 30 s. A bound, not a timing.
const slow = 120_000;

describe("span export", { timeout: slow }, () => {
  let collector: Awaited<ReturnType<typeof fakeCollector>>;
  beforeAll(async () => {
    collector = await fakeCollector();
  });
  afterAll(async () => {
    for (const child of running) child.kill("SIGKILL");
    await new Promise((r) => collector?.server.close(r));
  });

  it("with --otel-endpoint: a server span per RPC, the child of the caller's span, sent on shutdown", async () => {
    const { task, loaded } = await runCoordinator(["--otel-endpoint", collector.url]);
    expect(loaded).toContain("@opentelemetry/sdk-trace-node");
    const create = collector.spans.find(
      (s) => s.traceId === traceId && s.name === "meshwork.v1.TaskService/CreateTask",
    );
    expect(create).toBeDefined();
    if (!create) return;
    expect(create.parentSpanId).toBe(clientSpan);
    expect(create.kind).toBe(2); // SERVER
    expect(create.resource["service.name"]).toBe("meshwork");
    expect(attr(create, "rpc.system")).toBe("connect_rpc");
    expect(attr(create, "rpc.service")).toBe("meshwork.v1.TaskService");
    expect(attr(create, "rpc.method")).toBe("CreateTask");
    expect(attr(create, "rpc.grpc.status_code")).toBe(0);
    // Its statements (PGlite here) are its children, named without SQL.
    const insert = collector.spans.find(
      (s) => s.parentSpanId === create.spanId && s.name === "insert into tasks",
    );
    expect(insert).toMatchObject({ traceId, kind: 3 });
    expect(insert && attr(insert, "db.system")).toBe("postgresql");
    // The task stores the CreateTask span as its trace parent: a worker's calls are its children.
    expect(task.traceparent).toBe(`00-${traceId}-${create.spanId}-01`);
    const get = collector.spans.find(
      (s) => s.traceId === traceId && s.name === "meshwork.v1.TaskService/GetTask",
    );
    expect(get && attr(get, "rpc.grpc.status_code")).toBe(3);
    expect(get && attr(get, "rpc.connect_rpc.error_code")).toBe("invalid_argument");
    const list = collector.spans.find(
      (s) => s.traceId === traceId && s.name === "meshwork.v1.TaskService/ListTasks",
    );
    expect(list && attr(list, "rpc.system")).toBe("grpc");
    expect(list?.parentSpanId).toBe(clientSpan);
  });

  it("without an endpoint: no OpenTelemetry module is loaded, nothing is sent", async () => {
    const before = collector.spans.length;
    const { loaded, task } = await runCoordinator([]);
    expect(task.traceparent).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`));
    expect(loaded).toBe("");
    expect(collector.spans.length).toBe(before);
  });

  it("with a collector that never answers: calls still succeed, and the exit does not wait for it (the coordinator's own cap, not the exporter's timeout)", async () => {
    const hanging = createServer(() => {
      // Reads nothing, answers nothing.
    });
    const asked = new Promise<string | undefined>((resolve) =>
      hanging.once("request", (req: IncomingMessage) => resolve(req.url)),
    );
    await new Promise<void>((r) => hanging.listen(0, "127.0.0.1", r));
    const { port } = hanging.address() as AddressInfo;
    try {
      // The exporter's own timeout (10 s by default) pushed out of reach: an
      // exit while the collector still holds the export unanswered can only
      // come from the coordinator's cap on its last export (tracing/otel.ts).
      const { task, output } = await runCoordinator(
        ["--otel-endpoint", `http://127.0.0.1:${port}`],
        { OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: "600000" },
      );
      expect(task.traceparent).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`));
      expect(output).toContain('"msg":"stopped"');
      // It did try to send its spans: the export reached the collector, which never answered.
      expect(await within(10_000, asked)).toBe("/v1/traces");
    } finally {
      hanging.closeAllConnections();
      await new Promise((r) => hanging.close(r));
    }
  });

  it("makes a span per database statement, a child of the RPC's span, named without SQL", async () => {
    const ownTrace = "5b8aa5a2d2c872e8321cf37308d69df2";
    const realTrace = "6e0c63257de34c926f9efcd03899b1a4";
    const tdb = await createTestDatabase();
    const tracing = createOtelTracing(collector.url);
    try {
      const app = createApp(
        tdb.database,
        testConfig(),
        pino({ level: "silent" }),
        undefined,
        tracing,
      );
      const rpc = tracing.startRpc(
        "meshwork.v1.TaskService",
        "CreateTask",
        traceFromHeaders(`00-${ownTrace}-${clientSpan}-01`, ""),
        "connect_rpc",
      );
      rpc.run(() => {
        // What the database layer emits (db/observe.ts): started, then settled.
        app.database.statements.started("insert into tasks")();
        const failed = Object.assign(new Error("duplicate key"), { code: "23505" });
        app.database.statements.started("update tasks")(failed);
      });
      // Outside any RPC (the sweeper): no span.
      app.database.statements.started("select meshwork_sweep")();
      rpc.end("ok");
      // A real call on this test's database (PostgreSQL with DATABASE_URL): its insert is its child.
      const server = await listen(app, "127.0.0.1:0");
      try {
        const res = await fetch(`${server.url}/meshwork.v1.TaskService/CreateTask`, {
          method: "POST",
          headers: {
            "content-type": "application/json",
            traceparent: `00-${realTrace}-${clientSpan}-01`,
          },
          body: JSON.stringify({ workload: "otel-real" }),
        });
        expect(res.status).toBe(200);
      } finally {
        await server.close();
      }
    } finally {
      await tracing.shutdown();
      await tdb.drop();
    }
    const statements = collector.spans.filter(
      (s) => s.traceId === ownTrace && s.kind === 3, // CLIENT
    );
    const rpc = collector.spans.find((s) => s.traceId === ownTrace && s.kind === 2);
    expect(statements.map((s) => s.name).sort()).toEqual(["insert into tasks", "update tasks"]);
    for (const s of statements) {
      expect(s.parentSpanId).toBe(rpc?.spanId);
      expect(attr(s, "db.system")).toBe("postgresql");
    }
    const failed = statements.find((s) => s.name === "update tasks");
    expect(failed?.status?.code).toBe(2); // ERROR
    expect(failed && attr(failed, "db.response.status_code")).toBe("23505");
    expect(collector.spans.some((s) => s.name === "select meshwork_sweep")).toBe(false);
    const created = collector.spans.find(
      (s) => s.traceId === realTrace && s.name === "meshwork.v1.TaskService/CreateTask",
    );
    const inserts = collector.spans.filter(
      (s) => s.traceId === realTrace && s.name === "insert into tasks",
    );
    expect(inserts.length).toBeGreaterThan(0);
    for (const s of inserts) expect(s.parentSpanId).toBe(created?.spanId);
  });
});
