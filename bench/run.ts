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
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { closeSync, createReadStream, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { request } from "node:http";
import * as http2 from "node:http2";
import { createRequire, syncBuiltinESMExports } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import {
  ArtifactKind,
  ArtifactService,
  DownloadArtifactRequestSchema,
} from "../gen/meshwork/v1/artifact_pb.js";
import {
  type Coordinator,
  clients,
  drainScenario,
  drain as drainTasks,
  grpc,
  latency as latencyOf,
  print,
  rssOf,
  startCoordinator,
} from "./lib.js";

const env = process.env;
const totalTasks = Number(env.BENCH_TASKS ?? 20_000);
const workerCount = Number(env.BENCH_WORKERS ?? 16);
const latencySamples = Number(env.BENCH_LATENCY_SAMPLES ?? 1000);
const which = env.BENCH_DB ?? "both";
const scenarios = (env.BENCH_SCENARIOS ?? "drain,latency,artifacts").split(",");
const artifactMiB = Number(env.BENCH_ARTIFACT_MIB ?? 256);
const uploadChunkBytes = Number(env.BENCH_UPLOAD_CHUNK_KIB ?? 1024) * 1024;

/** Scenario 1: W workers claim and complete every task; batch = max_tasks. */
async function drain(co: Coordinator, batch: number) {
  const r = await drainTasks(co, { batch, tasks: totalTasks, workers: workerCount });
  print({
    scenario: drainScenario(batch),
    database: co.database,
    transport: "grpc-h2c",
    tasks: totalTasks,
    workers: workerCount,
    tasks_per_s: Math.round(totalTasks / r.seconds),
    seconds: Math.round(r.seconds * 100) / 100,
  });
  if (batch !== 1) {
    print({
      scenario: "2b-enqueue-createTasks-1000",
      database: co.database,
      tasks_per_s: Math.round(r.enqueueRate),
    });
  }
}

/** Scenario 3: one idle worker long-polls; serial CreateTask; create→claim latency. */
async function latency(co: Coordinator) {
  print({
    scenario: "3-create-to-claim-latency",
    database: co.database,
    transport: "grpc-h2c",
    ...(await latencyOf(co, latencySamples)),
  });
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
