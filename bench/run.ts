/**
 * `npm run bench`: scenarios 1 (drain) and 3 (create→claim
 * latency), against PostgreSQL and embedded PGlite. The coordinator runs as
 * its own process (`meshwork serve`), the workers in this one, over gRPC on
 * h2c, presenting the admin token the coordinator wrote (auth on, as in
 * production). Prints one JSON line per scenario and database. docs/benchmarks.md
 * says what each scenario measures and how to read the figures.
 *
 * Also the artifact scenario: a 256 MiB artifact uploaded and downloaded
 * over HTTP PUT/GET and over the streaming RPCs, with MB/s and the
 * coordinator's peak RSS growth, beside `sha256sum` of the same file. With
 * MESHWORK_BLOB_STORE=postgres (and BENCH_DB=postgres) the coordinator keeps
 * the bytes in the database instead of files.
 *
 * Environment: BENCH_DB=both|postgres|pglite, BENCH_SCENARIOS
 * (drain,latency,artifacts), BENCH_ARTIFACT_MIB (256), BENCH_TASKS (20000),
 * BENCH_WORKERS (16), BENCH_LATENCY_SAMPLES (1000), BENCH_PG_URL
 * (postgres://postgres@127.0.0.1:5432/postgres; a fresh database is created
 * and dropped inside it).
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import {
  closeSync,
  createReadStream,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  writeSync,
} from "node:fs";
import { request } from "node:http";
import * as http2 from "node:http2";
import { createRequire, syncBuiltinESMExports } from "node:module";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { type Client, createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, type GrpcTransportOptions } from "@connectrpc/connect-node";
import postgres from "postgres";
import {
  ArtifactKind,
  ArtifactService,
  DownloadArtifactRequestSchema,
} from "../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../gen/meshwork/v1/task_pb.js";

const env = process.env;
const totalTasks = Number(env.BENCH_TASKS ?? 20_000);
const workerCount = Number(env.BENCH_WORKERS ?? 16);
const latencySamples = Number(env.BENCH_LATENCY_SAMPLES ?? 1000);
const pgUrl = env.BENCH_PG_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const which = env.BENCH_DB ?? "both";
const scenarios = (env.BENCH_SCENARIOS ?? "drain,latency,artifacts").split(",");
const artifactMiB = Number(env.BENCH_ARTIFACT_MIB ?? 256);
const uploadChunkBytes = Number(env.BENCH_UPLOAD_CHUNK_KIB ?? 1024) * 1024;

interface Coordinator {
  url: string;
  database: string;
  pid: number;
  /** The admin token the coordinator wrote on its first start: every call presents it (auth on). */
  token: string;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

async function startCoordinator(database: "postgres" | "pglite"): Promise<Coordinator> {
  const port = await freePort();
  const dataDir = mkdtempSync(join(tmpdir(), "meshwork-bench-"));
  let dbName = "";
  let admin: postgres.Sql | undefined;
  const childEnv: NodeJS.ProcessEnv = { ...env, MESHWORK_LOG_LEVEL: "warn" };
  delete childEnv.DATABASE_URL;
  if (database === "postgres") {
    dbName = `meshwork_bench_${process.pid}_${Date.now()}`;
    admin = postgres(pgUrl, { max: 1, onnotice: () => {} });
    await admin.unsafe(`create database ${dbName}`);
    const url = new URL(pgUrl);
    url.pathname = `/${dbName}`;
    childEnv.DATABASE_URL = url.toString();
  }
  const child: ChildProcess = spawn(
    process.execPath,
    ["bin/meshwork.js", "serve", "--listen", `127.0.0.1:${port}`, "--data-dir", dataDir],
    { env: childEnv, stdio: ["ignore", "inherit", "inherit"] },
  );
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${url}/readyz`)).ok) break;
    } catch {
      // not listening yet
    }
    if (i > 200) throw new Error("coordinator did not start");
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    database,
    pid: child.pid ?? 0,
    token: readFileSync(join(dataDir, "admin.token"), "utf8").trim(),
    async stop() {
      child.kill("SIGTERM");
      await new Promise((r) => child.once("exit", r));
      if (admin) {
        await admin.unsafe(`drop database if exists ${dbName} with (force)`);
        await admin.end();
      }
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** A gRPC (h2c) transport to the coordinator that presents its admin token. */
function grpc(co: Coordinator, options: Partial<GrpcTransportOptions> = {}): Transport {
  const bearer: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${co.token}`);
    return next(req);
  };
  return createGrpcTransport({ ...options, baseUrl: co.url, interceptors: [bearer] });
}

interface Clients {
  fleet: Client<typeof FleetService>;
  tasks: Client<typeof TaskService>;
  leases: Client<typeof LeaseService>;
}

function clients(transport: Transport): Clients {
  return {
    fleet: createClient(FleetService, transport),
    tasks: createClient(TaskService, transport),
    leases: createClient(LeaseService, transport),
  };
}

function print(line: Record<string, unknown>) {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

/** Creates `n` tasks of `workload`, 1,000 per CreateTasks call; returns tasks/s. */
async function enqueue(c: Clients, workload: string, n: number): Promise<number> {
  const started = performance.now();
  for (let done = 0; done < n; done += 1000) {
    const count = Math.min(1000, n - done);
    await c.tasks.createTasks({ tasks: Array.from({ length: count }, () => ({ workload })) });
  }
  return n / ((performance.now() - started) / 1000);
}

/** Scenario 1: W workers claim and complete every task; batch = max_tasks. */
async function drain(co: Coordinator, batch: number) {
  const setup = clients(grpc(co));
  const workload = `drain-${batch}-${Date.now()}`;
  const enqueueRate = await enqueue(setup, workload, totalTasks);
  let completed = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: workerCount }, async () => {
      const c = clients(grpc(co));
      const { workerId } = await c.fleet.registerWorker({
        capabilities: [workload],
        maxConcurrency: batch,
      });
      while (completed < totalTasks) {
        const { claims } = await c.leases.claimTasks({ workerId, maxTasks: batch });
        if (claims.length === 0) {
          await new Promise((r) => setTimeout(r, 5));
          continue;
        }
        if (batch === 1) {
          for (const claim of claims) {
            await c.leases.completeTask({
              taskId: claim.taskId,
              workerId,
              attempt: claim.attempt,
              leaseToken: claim.leaseToken,
            });
          }
        } else {
          const { results } = await c.leases.completeTasks({
            completions: claims.map((claim) => ({
              taskId: claim.taskId,
              workerId,
              attempt: claim.attempt,
              leaseToken: claim.leaseToken,
            })),
          });
          if (results.some((r) => r.outcome.case !== "task"))
            throw new Error("a completion was refused");
        }
        completed += claims.length;
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  print({
    scenario: batch === 1 ? "1a-drain-claim1-complete1" : `1b-drain-claim${batch}-completeTasks`,
    database: co.database,
    transport: "grpc-h2c",
    tasks: totalTasks,
    workers: workerCount,
    tasks_per_s: Math.round(totalTasks / seconds),
    seconds: Math.round(seconds * 100) / 100,
  });
  if (batch !== 1) {
    print({
      scenario: "2b-enqueue-createTasks-1000",
      database: co.database,
      tasks_per_s: Math.round(enqueueRate),
    });
  }
}

/** Scenario 3: one idle worker long-polls; serial CreateTask; create→claim latency. */
async function latency(co: Coordinator) {
  const creator = clients(grpc(co));
  const worker = clients(grpc(co));
  const workload = `latency-${Date.now()}`;
  const { workerId } = await worker.fleet.registerWorker({ capabilities: [workload] });
  const samples: number[] = [];
  for (let i = 0; i < latencySamples; i++) {
    const polling = worker.leases.claimTasks({ workerId, maxTasks: 1, waitSeconds: 30 });
    // Let the long poll reach the server and start waiting.
    await new Promise((r) => setTimeout(r, 2));
    const sent = performance.now();
    await creator.tasks.createTask({ workload });
    const { claims } = await polling;
    if (claims.length !== 1) throw new Error("the long poll returned no task");
    samples.push(performance.now() - sent);
    const [claim] = claims;
    if (claim) {
      await worker.leases.completeTask({ taskId: claim.taskId, workerId, attempt: claim.attempt });
    }
  }
  samples.sort((a, b) => a - b);
  const pct = (p: number) =>
    Math.round((samples[Math.min(samples.length - 1, Math.floor(p * samples.length))] ?? 0) * 100) /
    100;
  print({
    scenario: "3-create-to-claim-latency",
    database: co.database,
    transport: "grpc-h2c",
    samples: samples.length,
    p50_ms: pct(0.5),
    p99_ms: pct(0.99),
    max_ms: pct(1),
  });
}

/** Resident memory of a process, in bytes (Linux). */
function rssOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = /VmRSS:\s+(\d+) kB/.exec(status)?.[1];
  return Number(kb ?? 0) * 1024;
}

/** Runs `transfer`, sampling the coordinator's RSS; returns MB/s and the peak RSS growth. */
async function measured(co: Coordinator, bytes: number, transfer: () => Promise<void>) {
  const base = rssOf(co.pid);
  let peak = base;
  const timer = setInterval(() => {
    peak = Math.max(peak, rssOf(co.pid));
  }, 20);
  const started = performance.now();
  await transfer();
  const seconds = (performance.now() - started) / 1000;
  clearInterval(timer);
  peak = Math.max(peak, rssOf(co.pid));
  return {
    mb_per_s: Math.round((bytes / 1e6 / seconds) * 10) / 10,
    rss_growth_mib: Math.round(((peak - base) / 1048576) * 10) / 10,
  };
}

/** PUT of a file with node:http, streamed; resolves with the response body. */
function putFile(url: URL, path: string, file: string, headers: Record<string, string | number>) {
  return new Promise<string>((resolve, reject) => {
    const req = request({ hostname: url.hostname, port: url.port, method: "PUT", path, headers });
    req.on("response", (res) => {
      let text = "";
      res.on("data", (d: Buffer) => {
        text += d.toString();
      });
      res.on("end", () => (res.statusCode === 201 ? resolve(text) : reject(new Error(text))));
    });
    req.on("error", reject);
    createReadStream(file).pipe(req);
  });
}

/**
 * connect-node's client keeps HTTP/2's 64 KiB connection-level receive
 * window (it offers no hook to open it), which throttles large downloads.
 * A worker that moves big artifacts opens it, as this does for the sessions
 * this process creates.
 */
function openClientWindows(): void {
  const require = createRequire(import.meta.url);
  const h2 = require("node:http2") as typeof http2;
  const connect = h2.connect;
  h2.connect = ((...args: Parameters<typeof http2.connect>) => {
    const session = connect(...args);
    session.once("connect", () => session.setLocalWindowSize(32 << 20));
    return session;
  }) as typeof http2.connect;
  syncBuiltinESMExports();
}

/** Artifact scenario: one artifact up and down over HTTP and over the streaming RPCs. */
async function artifactsScenario(co: Coordinator) {
  const size = artifactMiB * 1024 * 1024;
  const dir = mkdtempSync(join(tmpdir(), "meshwork-bench-blob-"));
  const file = join(dir, "blob.bin");
  const block = randomBytes(1024 * 1024);
  const out = openSync(file, "w");
  for (let i = 0; i < artifactMiB; i++) writeSync(out, block);
  closeSync(out);
  const t0 = performance.now();
  const digest = execFileSync("sha256sum", [file], { encoding: "utf8" }).split(" ")[0] ?? "";
  const sha256sumMbps = Math.round((size / 1e6 / ((performance.now() - t0) / 1000)) * 10) / 10;

  const c = clients(grpc(co));
  const workload = `bytes-${Date.now()}`;
  const { workerId } = await c.fleet.registerWorker({ capabilities: [workload] });
  await c.tasks.createTask({ workload, leaseSeconds: 3600 });
  const [claim] = (await c.leases.claimTasks({ workerId })).claims;
  if (!claim) throw new Error("no claim");
  // A client that streams large messages opens its HTTP/2 receive windows.
  if (env.BENCH_OPEN_CLIENT_WINDOW !== "0") openClientWindows();
  const artifactsClient = createClient(
    ArtifactService,
    grpc(co, { nodeOptions: { settings: { initialWindowSize: 4 * 1024 * 1024 } } }),
  );
  const results: Record<string, unknown>[] = [];

  let httpId = "";
  results.push({
    transfer: "http-put",
    ...(await measured(co, size, async () => {
      const body = await putFile(
        new URL(co.url),
        `/tasks/${claim.taskId}/artifacts/blob.bin`,
        file,
        {
          "content-length": size,
          "x-worker-id": workerId,
          "x-task-attempt": String(claim.attempt),
          "x-content-sha256": digest,
          authorization: `Bearer ${co.token}`,
        },
      );
      httpId = (JSON.parse(body) as { artifact_id: string }).artifact_id;
    })),
  });
  results.push({
    transfer: "http-get",
    ...(await measured(co, size, async () => {
      const res = await fetch(`${co.url}/artifacts/${httpId}/download`, {
        headers: { authorization: `Bearer ${co.token}` },
      });
      const hash = createHash("sha256");
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>)
        hash.update(chunk);
      if (hash.digest("hex") !== digest) throw new Error("download checksum mismatch");
    })),
  });
  let rpcId = "";
  results.push({
    transfer: "rpc-upload",
    ...(await measured(co, size, async () => {
      async function* messages() {
        yield {
          payload: {
            case: "header" as const,
            value: {
              taskId: claim?.taskId ?? "",
              workerId,
              attempt: claim?.attempt ?? 0,
              filename: "blob-rpc.bin",
              kind: ArtifactKind.OUTPUT,
              sha256: digest,
            },
          },
        };
        for await (const chunk of createReadStream(file, { highWaterMark: uploadChunkBytes })) {
          yield { payload: { case: "chunk" as const, value: chunk as Buffer } };
        }
      }
      const { artifact } = await artifactsClient.uploadArtifact(messages());
      rpcId = artifact?.artifactId ?? "";
    })),
  });
  results.push({
    transfer: "rpc-download",
    ...(await measured(co, size, async () => {
      const hash = createHash("sha256");
      for await (const res of artifactsClient.downloadArtifact({ artifactId: rpcId })) {
        hash.update(res.chunk);
      }
      if (hash.digest("hex") !== digest) throw new Error("download checksum mismatch");
    })),
  });
  // The same download read by a bare HTTP/2 client with a wide receive
  // window: what the coordinator can serve, without connect-node's client cost.
  results.push({
    transfer: "rpc-download-bare-h2-client",
    ...(await measured(co, size, async () => {
      const msg = toBinary(
        DownloadArtifactRequestSchema,
        create(DownloadArtifactRequestSchema, { artifactId: rpcId }),
      );
      const frame = Buffer.alloc(5 + msg.length);
      frame.writeUInt32BE(msg.length, 1);
      Buffer.from(msg).copy(frame, 5);
      const session = http2.connect(co.url, { settings: { initialWindowSize: 8 << 20 } });
      session.on("connect", () => session.setLocalWindowSize(32 << 20));
      const req = session.request({
        ":method": "POST",
        ":path": "/meshwork.v1.ArtifactService/DownloadArtifact",
        "content-type": "application/grpc",
        te: "trailers",
        authorization: `Bearer ${co.token}`,
      });
      let received = 0;
      req.on("data", (d: Buffer) => {
        received += d.length;
      });
      req.end(frame);
      await new Promise((resolve) => req.on("close", resolve));
      session.close();
      if (received < size) throw new Error("short download");
    })),
  });
  rmSync(dir, { recursive: true, force: true });
  for (const r of results) {
    print({
      scenario: `artifacts-${artifactMiB}MiB`,
      database: co.database,
      blob_store: env.MESHWORK_BLOB_STORE ?? "fs",
      ...r,
      sha256sum_mb_per_s: sha256sumMbps,
    });
  }
}

const databases =
  which === "both" ? (["postgres", "pglite"] as const) : ([which] as ["postgres" | "pglite"]);
for (const database of databases) {
  const co = await startCoordinator(database);
  try {
    if (scenarios.includes("drain")) {
      await drain(co, 1);
      await drain(co, 32);
    }
    if (scenarios.includes("latency")) await latency(co);
    if (scenarios.includes("artifacts")) await artifactsScenario(co);
  } finally {
    await co.stop();
  }
}
