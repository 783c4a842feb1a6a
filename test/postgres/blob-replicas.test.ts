import { createHash } from "node:crypto";
import { readdirSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import type { App } from "../../src/app.js";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { appOn, claimOne, uniqueWorkload } from "../support/harness.js";

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

const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
const bytes = (n: number, seed = 1) =>
  Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed + (i >> 10)) & 0xff);

function blobFiles(app: App): string[] {
  try {
    return readdirSync(join(app.config.blobDir, "sha256"), { recursive: true, withFileTypes: true })
      .filter((d) => d.isFile())
      .map((d) => d.name);
  } catch {
    return [];
  }
}

/**
 * Two coordinators on one PostgreSQL database with `--blob-store postgres`
 * and blob directories of their own, behind one public URL (B's, standing
 * for the load balancer): bytes stored through one are served by the other.
 */
describe.skipIf(!onPostgres)("replicas sharing artifacts through --blob-store postgres", () => {
  let tdb: TestDatabase;
  const apps: App[] = [];
  const servers: RunningServer[] = [];
  let a = "";
  let b = "";
  beforeAll(async () => {
    tdb = await createTestDatabase();
    const replica = await tdb.reopen();
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      const publicUrl = `http://127.0.0.1:${port}`;
      const overrides = { publicUrl, blobStore: { kind: "postgres" as const } };
      const appB = appOn(replica, overrides);
      try {
        servers.push(await listen(appB, `127.0.0.1:${port}`));
        apps.push(appOn(tdb.database, overrides), appB);
        b = publicUrl;
        break;
      } catch (error) {
        await appB.stop();
        if ((error as NodeJS.ErrnoException).code !== "EADDRINUSE" || attempt >= 5) throw error;
      }
    }
    const [appA] = apps;
    if (!appA) throw new Error("no app A");
    const serverA = await listen(appA, "127.0.0.1:0");
    servers.push(serverA);
    a = serverA.url;
  });
  afterAll(async () => {
    for (const s of servers) await s.close();
    await tdb?.drop();
  });

  const client = <S extends Parameters<typeof createClient>[0]>(service: S, baseUrl: string) =>
    createClient(service, createConnectTransport({ baseUrl, httpVersion: "1.1" }));

  it("stores through one replica and serves, ranges and completes through the other", async () => {
    const workload = uniqueWorkload("replicas");
    const input = bytes(300_000, 3);
    const { workerId } = await client(FleetService, a).registerWorker({
      capabilities: [workload],
      maxConcurrency: 4,
    });
    // The input is stored by A; B claims the task and serves the input.
    const created = await client(TaskService, a).createTask({
      workload,
      input: { case: "inputData", value: input },
    });
    const claim = await claimOne({ leases: client(LeaseService, b) }, workerId);
    expect(claim.taskId).toBe(created.task?.taskId);
    const gotInput = await fetch(`${b}/tasks/${claim.taskId}/input`);
    expect(gotInput.status).toBe(200);
    expect(sha(new Uint8Array(await gotInput.arrayBuffer()))).toBe(sha(input));

    // A 3.5 MiB output uploaded through A: several chunk rows.
    const output = bytes(3.5 * 1024 * 1024, 5);
    const put = await fetch(`${a}/tasks/${claim.taskId}/artifacts/out.bin`, {
      method: "PUT",
      body: output,
      headers: {
        "content-type": "application/octet-stream",
        "x-worker-id": workerId,
        "x-task-attempt": String(claim.attempt),
        "x-content-sha256": sha(output),
      },
    });
    expect(put.status).toBe(201);
    const ref = (await put.json()) as { artifact_id: string; uri: string; sha256: string };
    expect(ref.uri).toBe(`${b}/artifacts/${ref.artifact_id}/download`);

    // The artifact's URI, whole and a range across a chunk boundary, from B.
    const whole = await fetch(ref.uri);
    expect(whole.status).toBe(200);
    expect(whole.headers.get("content-length")).toBe(String(output.length));
    expect(sha(new Uint8Array(await whole.arrayBuffer()))).toBe(sha(output));
    const mib = 1024 * 1024;
    const part = await fetch(ref.uri, { headers: { range: `bytes=${mib - 10}-${2 * mib + 9}` } });
    expect(part.status).toBe(206);
    expect(new Uint8Array(await part.arrayBuffer())).toEqual(
      output.subarray(mib - 10, 2 * mib + 10),
    );

    // DownloadArtifact from B, whole and from an offset.
    const received: Uint8Array[] = [];
    for await (const res of client(ArtifactService, b).downloadArtifact({
      artifactId: ref.artifact_id,
    })) {
      received.push(res.chunk);
    }
    expect(sha(Buffer.concat(received))).toBe(sha(output));
    const tail: Uint8Array[] = [];
    for await (const res of client(ArtifactService, b).downloadArtifact({
      artifactId: ref.artifact_id,
      offset: BigInt(3 * mib),
      limit: 100n,
    })) {
      tail.push(res.chunk);
    }
    expect(Buffer.concat(tail)).toEqual(Buffer.from(output.subarray(3 * mib, 3 * mib + 100)));

    // Completed through B with the artifact stored through A; the result
    // served by A.
    const done = await client(LeaseService, b).completeTask({
      taskId: claim.taskId,
      workerId,
      attempt: claim.attempt,
      result: { artifactId: ref.artifact_id, uri: ref.uri, sha256: ref.sha256 },
    });
    expect(done.task?.state).toBe(TaskState.SUCCEEDED);
    const result = await fetch(`${a}/tasks/${claim.taskId}/result`);
    expect(result.status).toBe(200);
    expect(sha(new Uint8Array(await result.arrayBuffer()))).toBe(sha(output));

    // Nothing went to either blob directory.
    expect(apps.flatMap(blobFiles)).toEqual([]);
  });
});
