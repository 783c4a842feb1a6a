import { createHash } from "node:crypto";
import { readdirSync, unlinkSync } from "node:fs";
import { request } from "node:http";
import { connect, constants } from "node:http2";
import { createServer } from "node:net";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { count, eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { ArtifactKind, ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import type { App } from "../../src/app.js";
import { leftovers } from "../../src/artifacts/blob-store.js";
import { artifacts, blobs, blobUploads } from "../../src/db/schema/index.js";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { expireLease } from "../support/fixtures.js";
import { appOn, claimOne, uniqueWorkload } from "../support/harness.js";

const maxArtifactBytes = 2 * 1024 * 1024;
let tdb: TestDatabase;
let app: App;
let server: RunningServer;
let url: string;

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer()
      .once("error", reject)
      .listen(0, "127.0.0.1", () => {
        const { port } = s.address() as { port: number };
        s.close(() => resolve(port));
      });
  });
}

/**
 * Download URLs carry public_url, which the services read when the routes
 * are built, before the port is bound: so a free port is picked first, and
 * when another process takes it in between, another one is tried (bounded).
 */
async function listenWithPublicUrl(): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const candidate = `http://127.0.0.1:${port}`;
    const candidateApp = appOn(tdb.database, { publicUrl: candidate, maxArtifactBytes });
    try {
      server = await listen(candidateApp, `127.0.0.1:${port}`);
      app = candidateApp;
      url = candidate;
      return;
    } catch (error) {
      await candidateApp.stop();
      const inUse = (error as NodeJS.ErrnoException).code === "EADDRINUSE";
      if (!inUse || attempt >= 5) throw error;
    }
  }
}

beforeAll(async () => {
  tdb = await createTestDatabase();
  await listenWithPublicUrl();
});
afterAll(async () => {
  await server.close();
  await tdb.drop();
});

const grpc = () => createGrpcTransport({ baseUrl: url });
const fleet = () => createClient(FleetService, grpc());
const tasks = () => createClient(TaskService, grpc());
const leases = () => createClient(LeaseService, grpc());
const artifactClient = () => createClient(ArtifactService, grpc());
const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
const bytes = (n: number, seed = 1) =>
  Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) & 0xff);

/** A claimed task: its lease and the headers a worker sends with a PUT. */
async function claimed(input?: Uint8Array) {
  const workload = uniqueWorkload();
  const { workerId } = await fleet().registerWorker({
    capabilities: [workload],
    maxConcurrency: 10,
  });
  const created = await tasks().createTask({
    workload,
    ...(input && { input: { case: "inputData" as const, value: input } }),
  });
  const claim = await claimOne({ leases: leases() }, workerId);
  const lease = {
    taskId: claim.taskId,
    workerId,
    attempt: claim.attempt,
    leaseToken: claim.leaseToken,
  };
  const headers = { "x-worker-id": workerId, "x-task-attempt": String(claim.attempt) };
  return { claim, lease, headers, task: created.task };
}

/** A PUT with the path sent exactly as written (fetch would resolve `%2e%2e` itself). */
async function put(
  taskId: string,
  filename: string,
  body: Uint8Array,
  headers: Record<string, string>,
) {
  return new Promise<{ status: number; body: Record<string, string | number> }>(
    (resolve, reject) => {
      const { hostname, port } = new URL(url);
      const req = request({
        hostname,
        port,
        path: `/tasks/${taskId}/artifacts/${filename}`,
        method: "PUT",
        headers: { "content-type": "text/csv", "content-length": String(body.length), ...headers },
      });
      req.on("response", (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () =>
          resolve({
            status: res.statusCode ?? 0,
            body: JSON.parse(Buffer.concat(chunks).toString() || "{}"),
          }),
        );
      });
      // A refused upload may be answered before all of it is sent.
      req.on("error", (e) => reject(e));
      req.end(body);
    },
  );
}

async function rowsOfTask(taskId: string): Promise<number> {
  const [r] = await app.database.db
    .select({ n: count() })
    .from(artifacts)
    .where(eq(artifacts.taskId, taskId));
  return Number(r?.n ?? 0);
}

/** Blobs committed in the app's store (the suite runs on either: harness.ts, testBlobStore). */
async function blobCount(): Promise<number> {
  if (app.config.blobStore.kind === "postgres") {
    const [r] = await app.database.db.select({ n: count() }).from(blobs);
    return Number(r?.n ?? 0);
  }
  const root = join(app.config.blobDir, "sha256");
  try {
    return readdirSync(root, { recursive: true, withFileTypes: true }).filter((d) => d.isFile())
      .length;
  } catch {
    return 0;
  }
}

/** Temporary copies of uploads: none once an upload has finished either way. */
async function staged(): Promise<string[]> {
  if (app.config.blobStore.kind === "postgres") {
    const rows = await app.database.db.select({ id: blobUploads.id }).from(blobUploads);
    return rows.map((r) => r.id);
  }
  return leftovers(app.config.blobDir);
}

/** Removes a committed blob, leaving its artifact rows: a replica that does not hold the bytes. */
async function forgetBlob(sha: string): Promise<void> {
  if (app.config.blobStore.kind === "postgres") {
    await app.database.db.delete(blobs).where(eq(blobs.sha256, sha));
    return;
  }
  unlinkSync(join(app.config.blobDir, "sha256", sha.slice(0, 2), sha.slice(2, 4), sha));
}

describe("artifacts over plain HTTP", () => {
  it("stores a PUT with its checksum and serves it back with Content-Length, ETag and ranges", async () => {
    const { lease, headers } = await claimed();
    const data = bytes(100_000);
    const put1 = await put(lease.taskId, "out.csv", data, {
      ...headers,
      "x-content-sha256": sha(data),
    });
    expect(put1.status).toBe(201);
    expect(put1.body).toMatchObject({ sha256: sha(data), size_bytes: data.length });
    expect(put1.body.uri).toBe(`${url}/artifacts/${put1.body.artifact_id}/download`);
    const whole = await fetch(String(put1.body.uri));
    expect(whole.headers.get("content-length")).toBe("100000");
    expect(whole.headers.get("etag")).toBe(`"${sha(data)}"`);
    expect(sha(new Uint8Array(await whole.arrayBuffer()))).toBe(sha(data));
    const part = await fetch(String(put1.body.uri), { headers: { range: "bytes=10-19" } });
    expect(part.status).toBe(206);
    expect(part.headers.get("content-range")).toBe("bytes 10-19/100000");
    expect(new Uint8Array(await part.arrayBuffer())).toEqual(data.subarray(10, 20));
    const tail = await fetch(String(put1.body.uri), { headers: { range: "bytes=-5" } });
    expect(new Uint8Array(await tail.arrayBuffer())).toEqual(data.subarray(99_995));
    const beyond = await fetch(String(put1.body.uri), { headers: { range: "bytes=100000-" } });
    expect(beyond.status).toBe(416);
  });

  it("takes a client that goes away mid-download in its stride: nothing logged as an error", async () => {
    const { lease, headers } = await claimed();
    const data = bytes(maxArtifactBytes);
    const stored = await put(lease.taskId, "big.bin", data, headers);
    expect(stored.status).toBe(201);
    const errors = vi.spyOn(app.log, "error");
    try {
      // Over HTTP/2 the server can send only a flow-control window ahead of
      // what the client reads: cancelling after the headers cuts the body short.
      const session = connect(url);
      const cut = await new Promise<number>((resolve) => {
        const req = session.request({ ":path": new URL(String(stored.body.uri)).pathname });
        req.on("response", () => req.close(constants.NGHTTP2_CANCEL));
        req.on("close", () => resolve(req.rstCode));
        req.end();
      });
      session.close();
      expect(cut).toBe(constants.NGHTTP2_CANCEL);
      await new Promise((r) => setTimeout(r, 200)); // the server sees the reset
      expect(errors).not.toHaveBeenCalled();
    } finally {
      errors.mockRestore();
    }
    // And the next client gets every byte.
    const whole = await fetch(String(stored.body.uri));
    expect(sha(new Uint8Array(await whole.arrayBuffer()))).toBe(sha(data));
  });

  it("keeps the same bytes once however often they are stored", async () => {
    const { lease, headers } = await claimed();
    const data = bytes(5000, 7);
    const before = await blobCount();
    const a = await put(lease.taskId, "a.bin", data, headers);
    const b = await put(lease.taskId, "b.bin", data, headers);
    expect(a.body.artifact_id).not.toBe(b.body.artifact_id);
    expect(await blobCount()).toBe(before + 1);
    expect(await rowsOfTask(lease.taskId)).toBe(2);
    const first = await artifactClient().listArtifacts({ taskId: lease.taskId, pageSize: 1 });
    const second = await artifactClient().listArtifacts({
      taskId: lease.taskId,
      pageSize: 1,
      pageToken: first.nextPageToken,
    });
    expect([...first.artifacts, ...second.artifacts].map((a) => a.filename)).toEqual([
      "a.bin",
      "b.bin",
    ]);
    expect(second.nextPageToken).toBe("");
  });

  it("refuses each bad upload with its status and keeps nothing", async () => {
    const { lease, headers } = await claimed();
    const data = bytes(3000, 9);
    const filesBefore = await blobCount();
    const cases: [string, Record<string, string>, Uint8Array, number, string][] = [
      [
        "out.bin",
        { ...headers, "x-content-sha256": "0".repeat(64) },
        data,
        400,
        "invalid_argument",
      ],
      ["out.bin", { ...headers, "x-task-attempt": "2" }, data, 409, "aborted"],
      // The attempt in decimal digits only; a kind it knows, or none.
      ["out.bin", { ...headers, "x-task-attempt": "1e0" }, data, 400, "invalid_argument"],
      ["out.bin", { ...headers, "x-task-attempt": "0x1" }, data, 400, "invalid_argument"],
      ["out.bin", { ...headers, "x-artifact-kind": "input" }, data, 400, "invalid_argument"],
      ["out.bin", { ...headers, "x-artifact-kind": "x" }, data, 400, "invalid_argument"],
      [
        "out.bin",
        { ...headers, "x-worker-id": "00000000-0000-4000-8000-000000000009" },
        data,
        409,
        "aborted",
      ],
      ["out.bin", { ...headers, "x-lease-token": "f".repeat(64) }, data, 409, "aborted"],
      ["..%2Fx", headers, data, 400, "invalid_argument"],
      ["%2e%2e", headers, data, 400, "invalid_argument"],
      ["%2Fetc%2Fpasswd", headers, data, 400, "invalid_argument"],
      ["a%00b", headers, data, 400, "invalid_argument"],
      [".hidden", headers, data, 400, "invalid_argument"],
      ["", headers, data, 400, "invalid_argument"],
      ["big.bin", headers, bytes(maxArtifactBytes + 1), 429, "resource_exhausted"],
    ];
    for (const [name, h, body, status, code] of cases) {
      const res = await put(lease.taskId, name, body, h);
      expect({ name, status: res.status, error: res.body.error }).toEqual({
        name,
        status,
        error: code,
      });
    }
    expect(await rowsOfTask(lease.taskId)).toBe(0);
    expect(await blobCount()).toBe(filesBefore);
    expect(await staged()).toEqual([]);
  });

  it("refuses an upload under an expired lease", async () => {
    const { lease, headers } = await claimed();
    await expireLease(app.database.db, lease.taskId);
    const res = await put(lease.taskId, "late.bin", bytes(10), headers);
    expect(res).toMatchObject({ status: 409, body: { error: "aborted" } });
    expect(await rowsOfTask(lease.taskId)).toBe(0);
  });

  it("keeps nothing from an upload cut off half-way, and a retry succeeds", async () => {
    const { lease, headers } = await claimed();
    const data = bytes(1_000_000, 3);
    await new Promise<void>((resolve) => {
      const req = request(`${url}/tasks/${lease.taskId}/artifacts/cut.bin`, {
        method: "PUT",
        headers: { ...headers, "content-length": String(data.length) },
      });
      req.on("error", () => resolve());
      req.write(data.subarray(0, 300_000), () => {
        setTimeout(() => {
          req.destroy();
          resolve();
        }, 100);
      });
    });
    // The server notices the disconnect and removes its temporary file.
    for (let i = 0; i < 50 && (await staged()).length > 0; i++) {
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(await staged()).toEqual([]);
    expect(await rowsOfTask(lease.taskId)).toBe(0);
    const retry = await put(lease.taskId, "cut.bin", data, {
      ...headers,
      "x-content-sha256": sha(data),
    });
    expect(retry.status).toBe(201);
  });
});

describe("artifacts over the streaming RPCs", () => {
  it("uploads in chunks and downloads whole or by offset and limit", async () => {
    const data = bytes(700_000, 5);
    async function* upload() {
      yield {
        payload: {
          case: "header" as const,
          value: {
            filename: "input.bin",
            kind: ArtifactKind.INPUT,
            sha256: sha(data),
            sizeBytes: BigInt(data.length),
          },
        },
      };
      for (let i = 0; i < data.length; i += 64 * 1024) {
        yield { payload: { case: "chunk" as const, value: data.subarray(i, i + 64 * 1024) } };
      }
    }
    const { artifact } = await artifactClient().uploadArtifact(upload());
    expect(artifact).toMatchObject({
      sha256: sha(data),
      sizeBytes: BigInt(data.length),
      kind: ArtifactKind.INPUT,
    });
    const got: Uint8Array[] = [];
    for await (const res of artifactClient().downloadArtifact({
      artifactId: artifact?.artifactId ?? "",
    })) {
      got.push(res.chunk);
    }
    expect(sha(Buffer.concat(got))).toBe(sha(data));
    const part: Uint8Array[] = [];
    for await (const res of artifactClient().downloadArtifact({
      artifactId: artifact?.artifactId ?? "",
      offset: 1000n,
      limit: 500n,
    })) {
      part.push(res.chunk);
    }
    expect(Buffer.concat(part)).toEqual(Buffer.from(data.subarray(1000, 1500)));
    const meta = await artifactClient().getArtifact({ artifactId: artifact?.artifactId ?? "" });
    expect(meta.artifact?.filename).toBe("input.bin");
  });

  it("refuses a declared size that does not match, keeping nothing", async () => {
    async function* upload() {
      yield {
        payload: {
          case: "header" as const,
          value: { filename: "x.bin", kind: ArtifactKind.INPUT, sizeBytes: 5n },
        },
      };
      yield { payload: { case: "chunk" as const, value: bytes(6) } };
    }
    expect(await outcome(artifactClient().uploadArtifact(upload()))).toMatchObject({
      code: "InvalidArgument",
      reason: "SIZE_MISMATCH",
    });
    expect(await staged()).toEqual([]);
  });
});

describe("bytes this coordinator cannot reach", () => {
  it("answers 503 unavailable with a reason, over HTTP and the RPC, never a cut connection", async () => {
    const { lease, headers } = await claimed();
    const data = bytes(5000, 31);
    const up = await put(lease.taskId, "lost.bin", data, headers);
    expect(up.status).toBe(201);
    // As on a replica that does not share the blob store: the row, not the bytes.
    const sha = String(up.body.sha256);
    await forgetBlob(sha);
    const res = await fetch(`${url}/artifacts/${up.body.artifact_id}/download`);
    expect(res.status).toBe(503);
    expect(await res.json()).toMatchObject({
      error: "unavailable",
      message: expect.stringContaining("not in this coordinator's blob store"),
    });
    const stream = artifactClient().downloadArtifact({ artifactId: String(up.body.artifact_id) });
    expect(
      await outcome(
        (async () => {
          for await (const _ of stream);
        })(),
      ),
    ).toMatchObject({ code: "Unavailable" });
  });
});

describe("inputs, results and checkpoints", () => {
  it("runs a worker end to end: claim, download and verify the input, PUT the output, complete", async () => {
    const input = bytes(50_000, 11);
    const { claim, lease, headers } = await claimed(input);
    expect(claim.input).toMatchObject({ sha256: sha(input), sizeBytes: BigInt(input.length) });
    const got = new Uint8Array(
      await (await fetch(`${url}/tasks/${lease.taskId}/input`)).arrayBuffer(),
    );
    expect(sha(got)).toBe(claim.input?.sha256);
    const fromUri = new Uint8Array(await (await fetch(claim.input?.uri ?? "")).arrayBuffer());
    expect(sha(fromUri)).toBe(sha(input));
    const output = bytes(20_000, 13);
    const up = await put(lease.taskId, "result.csv", output, {
      ...headers,
      "x-content-sha256": sha(output),
    });
    const result = {
      artifactId: String(up.body.artifact_id),
      uri: String(up.body.uri),
      sha256: sha(output),
      contentType: "text/csv",
    };
    const { task } = await leases().completeTask({ ...lease, result });
    expect(task?.state).toBe(TaskState.SUCCEEDED);
    expect(task?.result).toMatchObject({ sha256: sha(output), sizeBytes: BigInt(output.length) });
    const res = await fetch(`${url}/tasks/${lease.taskId}/result`);
    expect(sha(new Uint8Array(await res.arrayBuffer()))).toBe(sha(output));
    expect((await leases().completeTask({ ...lease, result })).task?.state).toBe(
      TaskState.SUCCEEDED,
    );
  });

  it("refuses a result of another task, another attempt or another checksum (ARTIFACT_MISMATCH)", async () => {
    const mine = await claimed();
    const other = await claimed();
    const data = bytes(100, 17);
    const theirs = await put(other.lease.taskId, "o.bin", data, other.headers);
    const ours = await put(mine.lease.taskId, "o.bin", data, mine.headers);
    const ref = (b: Record<string, string | number>, sha256 = sha(data)) => ({
      artifactId: String(b.artifact_id),
      uri: String(b.uri),
      sha256,
    });
    const before = (await tasks().getTask({ taskId: mine.lease.taskId })).task;
    for (const result of [ref(theirs.body), ref(ours.body, "a".repeat(64))]) {
      expect(await outcome(leases().completeTask({ ...mine.lease, result }))).toMatchObject({
        code: "Aborted",
        reason: "ARTIFACT_MISMATCH",
      });
    }
    expect((await tasks().getTask({ taskId: mine.lease.taskId })).task).toEqual(before);
    // Another attempt: the task is reclaimed, the first attempt's artifact no longer fits.
    // The sweeper runs here and may hold the expired row for a moment (the
    // claim skips locked rows): a long poll is woken when it lets go.
    await expireLease(app.database.db, mine.lease.taskId);
    const { claims } = await leases().claimTasks({
      workerId: mine.lease.workerId,
      waitSeconds: 10,
    });
    const second = claims.find((c) => c.taskId === mine.lease.taskId);
    expect(second?.attempt).toBe(2);
    const res = await outcome(
      leases().completeTask({
        ...mine.lease,
        attempt: 2,
        leaseToken: second?.leaseToken ?? "",
        result: ref(ours.body),
      }),
    );
    expect(res).toMatchObject({ code: "Aborted", reason: "ARTIFACT_MISMATCH" });
  });

  it("hands a CHECKPOINT artifact to the next claim and refuses one of another kind", async () => {
    const { lease, headers } = await claimed();
    const ckpt = await put(lease.taskId, "state.ckpt", bytes(64), {
      ...headers,
      "x-artifact-kind": "checkpoint",
    });
    const output = await put(lease.taskId, "out.bin", bytes(64, 2), headers);
    expect(
      await outcome(
        leases().releaseTask({ ...lease, checkpointHandle: String(output.body.artifact_id) }),
      ),
    ).toMatchObject({ code: "Aborted", reason: "ARTIFACT_MISMATCH" });
    await leases().releaseTask({ ...lease, checkpointHandle: String(ckpt.body.artifact_id) });
    const { claims } = await leases().claimTasks({ workerId: lease.workerId });
    expect(claims.find((c) => c.taskId === lease.taskId)?.checkpointHandle).toBe(
      ckpt.body.artifact_id,
    );
  });

  it("creates a task from an uploaded INPUT, and refuses unknown, oversized or non-INPUT inputs", async () => {
    async function* upload() {
      yield {
        payload: {
          case: "header" as const,
          value: { filename: "in.bin", kind: ArtifactKind.INPUT },
        },
      };
      yield { payload: { case: "chunk" as const, value: bytes(10, 21) } };
    }
    const { artifact } = await artifactClient().uploadArtifact(upload());
    const { task } = await tasks().createTask({
      workload: "w",
      input: { case: "inputArtifactId", value: artifact?.artifactId ?? "" },
    });
    expect(task?.input?.artifactId).toBe(artifact?.artifactId);
    const missing = {
      case: "inputArtifactId" as const,
      value: "00000000-0000-4000-8000-000000000000",
    };
    expect((await outcome(tasks().createTask({ workload: "w", input: missing }))).code).toBe(
      "NotFound",
    );
    const big = { case: "inputData" as const, value: bytes(1024 * 1024 + 1) };
    expect((await outcome(tasks().createTask({ workload: "w", input: big }))).code).toBe(
      "InvalidArgument",
    );
    const { lease, headers } = await claimed();
    const out = await put(lease.taskId, "o.bin", bytes(5), headers);
    const notInput = { case: "inputArtifactId" as const, value: String(out.body.artifact_id) };
    expect((await outcome(tasks().createTask({ workload: "w", input: notInput }))).code).toBe(
      "InvalidArgument",
    );
  });
});
