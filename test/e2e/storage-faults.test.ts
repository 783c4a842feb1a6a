import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  ArtifactService,
  type UploadArtifactRequest,
  UploadArtifactRequestSchema,
} from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import type { App } from "../../src/app.js";
import { BlobStoreUnavailable, storageFailure } from "../../src/artifacts/blob-unavailable.js";
import { artifactCommand, uploadInput } from "../../src/cli/artifact.js";
import { DomainError } from "../../src/core/errors.js";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { appOn, claimOne, testBlobStore, uniqueWorkload } from "../support/harness.js";
import { textSink } from "../support/text-sink.js";

describe("storage failures as clients see them", () => {
  it("out of space (ENOSPC, EDQUOT) is resource_exhausted STORAGE_FULL; other failures unavailable", () => {
    for (const code of ["ENOSPC", "EDQUOT"]) {
      const e = storageFailure("writing", Object.assign(new Error("full"), { code }));
      expect(e).toBeInstanceOf(DomainError);
      expect((e as DomainError).kind).toBe("resource_exhausted");
      expect((e as DomainError).reason).toBe("STORAGE_FULL");
    }
    for (const code of ["EIO", "EROFS", "EACCES"]) {
      expect(storageFailure("writing", Object.assign(new Error("io"), { code }))).toBeInstanceOf(
        BlobStoreUnavailable,
      );
    }
  });
});

/** A 1 MiB tmpfs, where this machine lets us mount one (root, Linux): a real full disk. */
function mountSmallDisk(): string | undefined {
  if (process.platform !== "linux" || process.getuid?.() !== 0) return undefined;
  const dir = mkdtempSync(join(tmpdir(), "meshwork-full-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", dir], { stdio: "ignore" });
    return dir;
  } catch {
    rmSync(dir, { recursive: true, force: true });
    return undefined;
  }
}

const disk = testBlobStore.kind === "fs" ? mountSmallDisk() : undefined;

describe.skipIf(!disk)("a full disk under the file blob store", () => {
  let tdb: TestDatabase;
  let server: RunningServer;
  const blobDir = join(disk ?? "", "blobs");
  beforeAll(async () => {
    mkdirSync(blobDir, { recursive: true });
    tdb = await createTestDatabase();
    server = await listen(appOn(tdb.database, { blobDir }), "127.0.0.1:0");
  });
  afterAll(async () => {
    await server?.close();
    await tdb?.drop();
    if (disk) {
      execFileSync("umount", [disk]);
      rmSync(disk, { recursive: true, force: true });
    }
  });

  const transport = () => createGrpcTransport({ baseUrl: server.url });
  async function claimed() {
    const workload = uniqueWorkload();
    const { workerId } = await createClient(FleetService, transport()).registerWorker({
      capabilities: [workload],
    });
    await createClient(TaskService, transport()).createTask({ workload });
    const claim = await claimOne({ leases: createClient(LeaseService, transport()) }, workerId);
    return { claim, workerId };
  }
  const temporaryFiles = () => readdirSync(join(blobDir, "tmp"));
  const bigger = Buffer.alloc(3 * 1024 * 1024, 7);

  it("PUT: 507 with resource_exhausted STORAGE_FULL, nothing kept, and a small upload works after", async () => {
    const { claim, workerId } = await claimed();
    const put = (body: Buffer, name: string) =>
      fetch(`${server.url}/tasks/${claim.taskId}/artifacts/${name}`, {
        method: "PUT",
        headers: { "x-worker-id": workerId, "x-task-attempt": String(claim.attempt) },
        body,
      });
    const res = await put(bigger, "big.bin");
    expect(res.status).toBe(507);
    expect(await res.json()).toMatchObject({ error: "resource_exhausted", reason: "STORAGE_FULL" });
    expect(temporaryFiles()).toEqual([]);
    const artifacts = await createClient(ArtifactService, transport()).listArtifacts({
      taskId: claim.taskId,
    });
    expect(artifacts.artifacts).toEqual([]);
    expect((await put(Buffer.from("fits"), "small.txt")).status).toBe(201);
  });

  it("UploadArtifact: resource_exhausted, nothing kept", async () => {
    const { claim, workerId } = await claimed();
    async function* messages(): AsyncGenerator<UploadArtifactRequest> {
      yield create(UploadArtifactRequestSchema, {
        payload: {
          case: "header",
          value: {
            taskId: claim.taskId,
            workerId,
            attempt: claim.attempt,
            leaseToken: claim.leaseToken,
            filename: "big.bin",
          },
        },
      });
      for (let at = 0; at < bigger.length; at += 256 * 1024) {
        yield create(UploadArtifactRequestSchema, {
          payload: { case: "chunk", value: bigger.subarray(at, at + 256 * 1024) },
        });
      }
    }
    const refused = await outcome(
      createClient(ArtifactService, transport()).uploadArtifact(messages()),
    );
    expect(refused).toMatchObject({ code: "ResourceExhausted", reason: "STORAGE_FULL" });
    expect(temporaryFiles()).toEqual([]);
  });
});

describe.skipIf(testBlobStore.kind !== "fs")("stored bytes that changed on disk", () => {
  let tdb: TestDatabase;
  let app: App;
  let server: RunningServer;
  const blobDir = mkdtempSync(join(tmpdir(), "meshwork-rot-"));
  beforeAll(async () => {
    tdb = await createTestDatabase();
    app = appOn(tdb.database, { blobDir });
    server = await listen(app, "127.0.0.1:0");
  });
  afterAll(async () => {
    await server?.close();
    await tdb?.drop();
  });

  const transport = () => createGrpcTransport({ baseUrl: server.url });
  const data = Buffer.from(Uint8Array.from({ length: 1_000_000 }, (_, i) => (i * 13) & 0xff));
  const sha256 = createHash("sha256").update(data).digest("hex");
  const fileOf = (hash: string) =>
    join(blobDir, "sha256", hash.slice(0, 2), hash.slice(2, 4), hash);
  const put = () => uploadInput({ url: server.url, token: "" }, writeTemp(data));
  const writeTemp = (bytes: Buffer) => {
    const path = join(mkdtempSync(join(tmpdir(), "meshwork-in-")), "in.bin");
    writeFileSync(path, bytes);
    return path;
  };
  /** A download's status and how many bytes came before it ended (or failed). */
  async function download(id: string, range?: string) {
    const res = await fetch(`${server.url}/artifacts/${id}/download`, {
      headers: range ? { range } : {},
    });
    let got = 0;
    let failed = false;
    try {
      for await (const c of res.body as unknown as AsyncIterable<Uint8Array>) got += c.byteLength;
    } catch {
      failed = true;
    }
    return { status: res.status, got, failed };
  }

  it("is never served as good: the download is cut, later ones refused, verify reports it, the same bytes uploaded repair it", async () => {
    const artifact = await put();
    expect(artifact.sha256).toBe(sha256);
    expect(await download(artifact.artifactId)).toMatchObject({ status: 200, got: data.length });
    // One byte flipped on disk, behind the coordinator's back.
    const path = fileOf(sha256);
    const onDisk = readFileSync(path);
    onDisk[500_000] = ((onDisk[500_000] ?? 0) + 1) % 256;
    writeFileSync(path, onDisk);

    const cut = await download(artifact.artifactId);
    expect(cut.status).toBe(200);
    expect(cut.failed || cut.got < data.length).toBe(true);
    // Known now: refused at once, whole or ranged, over HTTP and RPC.
    const refused = await fetch(`${server.url}/artifacts/${artifact.artifactId}/download`, {
      headers: { range: "bytes=0-9" },
    });
    expect(refused.status).toBe(500);
    expect(await refused.json()).toMatchObject({ error: "data_loss", reason: "ARTIFACT_CORRUPT" });
    const rpc = createClient(ArtifactService, transport());
    const streamed = await outcome(
      (async () => {
        for await (const _ of rpc.downloadArtifact({ artifactId: artifact.artifactId }));
      })(),
    );
    expect(streamed).toMatchObject({ code: "DataLoss", reason: "ARTIFACT_CORRUPT" });
    expect(await app.metrics.scrape()).toMatch(/^meshwork_artifact_corrupt_total 1$/m);

    const io = capture();
    expect(await artifactCommand(["verify", "--url", server.url, "--token", "x"], io)).toBe(1);
    expect(io.text()).toContain(`corrupt  ${sha256}`);
    expect(io.text()).toContain(artifact.artifactId);
    expect(io.text()).toMatch(/checked \d+ blobs .*: 1 corrupt/);

    // The same bytes again: the good copy takes the corrupt one's place.
    await put();
    expect(await download(artifact.artifactId)).toMatchObject({ status: 200, got: data.length });
    expect(readFileSync(path).equals(data)).toBe(true);
    const after = capture();
    expect(await artifactCommand(["verify", "--url", server.url, "--token", "x"], after)).toBe(0);
    expect(after.text()).toMatch(/: 0 corrupt/);
  });
});

/** An Io that keeps what a command writes. */
function capture() {
  const sink = textSink();
  return { out: sink.stream, err: sink.stream, text: sink.text };
}
