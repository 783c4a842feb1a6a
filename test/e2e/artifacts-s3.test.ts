import { createHash, randomBytes } from "node:crypto";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { ArtifactKind, ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import type { Config } from "../../src/config.js";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { appOn, claimOne, uniqueWorkload } from "../support/harness.js";
import { startS3, type TestS3 } from "../support/s3.js";

const MiB = 1024 * 1024;
const prefix = "e2e/";
let s3: TestS3;
let tdb: TestDatabase;
let server: RunningServer;

/** A coordinator with `--blob-store s3://<bucket>/e2e` on `database`, listening on port 0. */
async function coordinator(database = tdb.database): Promise<RunningServer> {
  const blobStore: Config["blobStore"] = { kind: "s3", bucket: s3.bucket, prefix };
  return listen(appOn(database, { blobStore }), "127.0.0.1:0");
}

beforeAll(async () => {
  s3 = await startS3();
  // What `serve` reads: endpoint, region, keys (blob-s3.ts, s3ClientConfig).
  Object.assign(process.env, s3.env);
  tdb = await createTestDatabase();
  server = await coordinator();
});
afterAll(async () => {
  await server?.close();
  await tdb?.drop();
  await s3?.close();
});

const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
const artifactsOf = (url: string) =>
  createClient(ArtifactService, createGrpcTransport({ baseUrl: url }));

async function uploadInput(url: string, data: Uint8Array) {
  async function* messages() {
    yield {
      payload: {
        case: "header" as const,
        value: { filename: "in.bin", kind: ArtifactKind.INPUT, sha256: sha(data) },
      },
    };
    for (let i = 0; i < data.length; i += 256 * 1024) {
      yield { payload: { case: "chunk" as const, value: data.subarray(i, i + 256 * 1024) } };
    }
  }
  const { artifact } = await artifactsOf(url).uploadArtifact(messages());
  return artifact?.artifactId ?? "";
}

async function download(url: string, artifactId: string, offset = 0n, limit = 0n) {
  const got: Uint8Array[] = [];
  for await (const res of artifactsOf(url).downloadArtifact({ artifactId, offset, limit })) {
    got.push(res.chunk);
  }
  return Buffer.concat(got);
}

describe("artifacts in S3 (s3rver)", () => {
  it("round-trips a multipart upload: UploadArtifact, HTTP GET whole and by range, DownloadArtifact", async () => {
    const data = randomBytes(12 * MiB + 123);
    const id = await uploadInput(server.url, data);
    expect(await s3.keys(prefix)).toContain(`${prefix}sha256/${sha(data)}`);
    expect(await s3.keys(`${prefix}tmp/`)).toEqual([]);
    expect(await s3.openUploads()).toEqual([]);
    const whole = await fetch(`${server.url}/artifacts/${id}/download`);
    expect(whole.status).toBe(200);
    expect(whole.headers.get("content-length")).toBe(String(data.length));
    expect(sha(new Uint8Array(await whole.arrayBuffer()))).toBe(sha(data));
    const part = await fetch(`${server.url}/artifacts/${id}/download`, {
      headers: { range: `bytes=${8 * MiB - 2}-${8 * MiB + 1}` },
    });
    expect(part.status).toBe(206);
    expect(Buffer.from(await part.arrayBuffer())).toEqual(data.subarray(8 * MiB - 2, 8 * MiB + 2));
    expect(sha(await download(server.url, id))).toBe(sha(data));
    expect(await download(server.url, id, 1000n, 500n)).toEqual(data.subarray(1000, 1500));
  });

  it("stores a worker's PUT and serves it back", async () => {
    const transport = createGrpcTransport({ baseUrl: server.url });
    const workload = uniqueWorkload();
    const { workerId } = await createClient(FleetService, transport).registerWorker({
      capabilities: [workload],
      maxConcurrency: 1,
    });
    await createClient(TaskService, transport).createTask({ workload });
    const claim = await claimOne({ leases: createClient(LeaseService, transport) }, workerId);
    const data = randomBytes(100_000);
    const put = await fetch(`${server.url}/tasks/${claim.taskId}/artifacts/out.bin`, {
      method: "PUT",
      headers: { "x-worker-id": workerId, "x-task-attempt": String(claim.attempt) },
      body: data,
    });
    expect(put.status).toBe(201);
    const { artifact_id } = (await put.json()) as { artifact_id: string };
    const got = await fetch(`${server.url}/artifacts/${artifact_id}/download`);
    expect(sha(new Uint8Array(await got.arrayBuffer()))).toBe(sha(data));
  });

  it("answers 503 unavailable, not internal, while S3 fails: download, upload, DownloadArtifact", async () => {
    const stored = randomBytes(1000);
    const id = await uploadInput(server.url, stored);
    s3.fault = { status: 503, match: (_method, path) => path.includes(`/${prefix}`) };
    try {
      const get = await fetch(`${server.url}/artifacts/${id}/download`);
      expect(get.status).toBe(503);
      expect(get.headers.get("retry-after")).toBe("1");
      expect(await get.json()).toEqual({
        error: "unavailable",
        message: "the artifact store is unavailable for a moment; retry",
      });
      expect(await outcome(download(server.url, id))).toMatchObject({
        code: "Unavailable",
        message: "the artifact store is unavailable for a moment; retry",
      });
      expect(await outcome(uploadInput(server.url, randomBytes(1000)))).toMatchObject({
        code: "Unavailable",
        message: "the artifact store is unavailable for a moment; retry",
      });
    } finally {
      s3.fault = undefined;
    }
    // And once S3 answers again, so does the coordinator.
    expect(await download(server.url, id)).toEqual(stored);
  });

  it("closes the S3 store (its clients' sockets) when the coordinator stops, after the requests", async () => {
    const blobStore: Config["blobStore"] = { kind: "s3", bucket: s3.bucket, prefix };
    const app = appOn(tdb.database, { blobStore });
    const close = vi.spyOn(app.blobs, "close");
    const other = await listen(app, "127.0.0.1:0");
    const data = randomBytes(1000);
    expect(await download(other.url, await uploadInput(other.url, data))).toEqual(data);
    expect(close).not.toHaveBeenCalled();
    await other.close();
    expect(close).toHaveBeenCalledOnce();
  });

  // Two coordinators on one database need PostgreSQL (an embedded PGlite
  // belongs to one process).
  it.skipIf(!onPostgres)(
    "serves bytes one replica stored from the other (one bucket)",
    async () => {
      const other = await coordinator(await tdb.reopen());
      try {
        const data = randomBytes(3 * MiB);
        const id = await uploadInput(server.url, data);
        const res = await fetch(`${other.url}/artifacts/${id}/download`);
        expect(res.status).toBe(200);
        expect(sha(new Uint8Array(await res.arrayBuffer()))).toBe(sha(data));
        expect(sha(await download(other.url, id))).toBe(sha(data));
        const back = await uploadInput(other.url, data);
        expect(sha(await download(server.url, back))).toBe(sha(data));
      } finally {
        await other.close();
      }
    },
  );
});
