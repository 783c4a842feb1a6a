import { randomBytes, randomUUID } from "node:crypto";
import { createServer, type Socket } from "node:net";
import type { Readable } from "node:stream";
import {
  CreateMultipartUploadCommand,
  GetObjectCommand,
  PutObjectCommand,
} from "@aws-sdk/client-s3";
import { Code } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import {
  createS3BlobStore,
  createS3Clients,
  nextPartBytes,
  type S3BlobStoreOptions,
  s3ClientConfig,
} from "../../src/artifacts/blob-s3.js";
import { BlobStoreUnavailable } from "../../src/artifacts/blob-unavailable.js";
import { createErrorMapper } from "../../src/rpc/errors.js";
import { toTask } from "../../src/tasks/convert.js";
import {
  blobStoreContract,
  chunks,
  readAll,
  sha,
  verifiedReadContract,
} from "../support/blob-store-contract.js";
import { startS3, type TestS3 } from "../support/s3.js";

const MiB = 1024 * 1024;
let s3: TestS3;
beforeAll(async () => {
  s3 = await startS3();
});
afterAll(() => s3?.close());

/** A store under a prefix of its own, and the S3 calls it makes (by command name). */
function storeOf(options: Partial<S3BlobStoreOptions> = {}) {
  const prefix = `t-${randomUUID().slice(0, 8)}/`;
  const client = options.client ?? s3.client();
  const calls: string[] = [];
  client.middlewareStack.add(
    (next, context) => (args) => {
      calls.push(String(context.commandName).replace(/Command$/, ""));
      return next(args);
    },
    { step: "initialize" },
  );
  const store = createS3BlobStore({
    bucket: s3.bucket,
    prefix,
    partBytes: 5 * MiB,
    ...options,
    client,
  });
  return {
    store,
    prefix,
    calls,
    /** Objects under tmp/ and multipart uploads still open. */
    leftovers: async () => [
      ...(await s3.keys(`${prefix}tmp/`)),
      ...(await s3.openUploads()).filter((k) => k.startsWith(prefix)).map((k) => `upload:${k}`),
    ],
  };
}

/** `n` MiB in chunks of 1 MiB (a socket's chunks are smaller; the store must not care). */
function mebibytes(n: number): Buffer[] {
  return Array.from({ length: n }, () => randomBytes(MiB));
}

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

/** A TCP server that accepts connections and never answers. */
async function silentServer(): Promise<{ url: string; close(): Promise<void> }> {
  const sockets: Socket[] = [];
  const server = createServer((socket) => sockets.push(socket));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** What `promise` settles to, or "still waiting" after `ms`. */
function within<T>(ms: number, promise: Promise<T>): Promise<T | "still waiting"> {
  return Promise.race([
    promise,
    new Promise<"still waiting">((resolve) => setTimeout(() => resolve("still waiting"), ms)),
  ]);
}

/** How a stream ended: its error, or "closed" without one. */
function ending(stream: Readable): Promise<unknown> {
  return new Promise((resolve) => {
    stream.once("error", resolve);
    stream.once("close", () => resolve("closed"));
  });
}

describe("S3 blob store", () => {
  describe("the blob store contract", () => {
    blobStoreContract(async () => storeOf());
    verifiedReadContract(async () => {
      const t = storeOf();
      return {
        store: t.store,
        // Another writer puts different bytes under the blob's key.
        async damage(hash: string) {
          const key = `${t.prefix}sha256/${hash}`;
          const client = s3.client();
          const got = await client.send(new GetObjectCommand({ Bucket: s3.bucket, Key: key }));
          const body = Buffer.from(
            await (
              got.Body as { transformToByteArray(): Promise<Uint8Array> }
            ).transformToByteArray(),
          );
          body[12_345] = ((body[12_345] ?? 0) + 1) % 256;
          await client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: key, Body: body }));
        },
      };
    });
  });

  it("removes what crashed uploads left under tmp/ once old enough, and nothing younger", async () => {
    const young = storeOf();
    const client = s3.client();
    const key = `${young.prefix}tmp/crashed`;
    await client.send(new CreateMultipartUploadCommand({ Bucket: s3.bucket, Key: key }));
    await client.send(
      new PutObjectCommand({ Bucket: s3.bucket, Key: `${young.prefix}tmp/half`, Body: "x" }),
    );
    expect(await young.store.removeAbandoned?.()).toBe(0);
    expect((await young.leftovers()).length).toBe(2);
    const old = storeOf({ abandonedAfterMs: 0 });
    await client.send(
      new CreateMultipartUploadCommand({ Bucket: s3.bucket, Key: `${old.prefix}tmp/a` }),
    );
    await client.send(
      new PutObjectCommand({ Bucket: s3.bucket, Key: `${old.prefix}tmp/b`, Body: "x" }),
    );
    expect(await old.store.removeAbandoned?.()).toBe(2);
    expect(await old.leftovers()).toEqual([]);
    // Another prefix's leftovers are not this store's.
    expect((await young.leftovers()).length).toBe(2);
  });

  it("keys a committed blob <prefix>sha256/<hex>, and uploads it with one PutObject when it fits one part", async () => {
    const t = storeOf();
    const staged = await t.store.stage(chunks("small"), 100);
    await staged.commit();
    expect(await s3.keys(t.prefix)).toEqual([`${t.prefix}sha256/${sha("small")}`]);
    expect(t.calls).toEqual(["PutObject", "HeadObject", "CopyObject", "DeleteObject"]);
  });

  it("uploads more than a part as a multipart upload, one part after the other, and reads it back", async () => {
    const t = storeOf();
    const data = mebibytes(12);
    const staged = await t.store.stage(chunks(...data), 100 * MiB);
    const whole = Buffer.concat(data);
    expect(staged).toMatchObject({ sha256: sha(whole), size: 12 * MiB });
    expect(t.calls).toEqual([
      "CreateMultipartUpload",
      "UploadPart",
      "UploadPart",
      "UploadPart",
      "CompleteMultipartUpload",
    ]);
    await staged.commit();
    expect(sha(await readAll(t.store.read(staged.sha256)))).toBe(sha(whole));
    const range = await readAll(
      t.store.read(staged.sha256, { start: 5 * MiB - 3, end: 5 * MiB + 2 }),
    );
    expect(range).toEqual(whole.subarray(5 * MiB - 3, 5 * MiB + 3));
    expect(await t.leftovers()).toEqual([]);
  });

  it("keeps 8 MiB parts for 1,000 parts, then doubles them: 10,000 parts hold about 8 TB, none over 5 GiB", () => {
    const sizes = Array.from({ length: 10_000 }, (_, sent) => nextPartBytes(8 * MiB, sent));
    expect(sizes[999]).toBe(8 * MiB);
    expect(sizes[1000]).toBe(16 * MiB);
    expect(Math.max(...sizes)).toBeLessThanOrEqual(5 * 1024 * MiB);
    expect(sizes.reduce((a, b) => a + b, 0)).toBeGreaterThan(8e12);
  });

  it("uploads exactly one part's worth with one PutObject", async () => {
    const t = storeOf();
    await (await t.store.stage(chunks(...mebibytes(5)), 100 * MiB)).discard();
    expect(t.calls).toEqual(["PutObject", "DeleteObject"]);
  });

  it("refuses an oversize multipart upload as soon as it is too large: no object, no open upload", async () => {
    const t = storeOf();
    await expect(t.store.stage(chunks(...mebibytes(12)), 11 * MiB)).rejects.toMatchObject({
      kind: "resource_exhausted",
      reason: "ARTIFACT_TOO_LARGE",
    });
    expect(t.calls).toContain("UploadPart");
    expect(t.calls).toContain("AbortMultipartUpload");
    expect(await t.leftovers()).toEqual([]);
  });

  it("aborts the multipart upload when the source fails after some parts", async () => {
    const t = storeOf();
    async function* broken() {
      yield* chunks(...mebibytes(11));
      throw new Error("client went away");
    }
    await expect(t.store.stage(broken(), 100 * MiB)).rejects.toThrow("client went away");
    expect(await t.leftovers()).toEqual([]);
  });

  it("aborts the multipart upload when S3 fails a part: unavailable, nothing left", async () => {
    const t = storeOf({ client: s3.client({ maxAttempts: 1 }) });
    s3.fault = {
      status: 500,
      match: (method, path, query) =>
        method === "PUT" && path.includes(t.prefix) && query.partNumber === "2",
    };
    try {
      const error = await t.store.stage(chunks(...mebibytes(12)), 100 * MiB).catch((e) => e);
      expect(error).toBeInstanceOf(BlobStoreUnavailable);
      expect(error.message).toMatch(/^S3 UploadPart failed: .*HTTP 500/);
    } finally {
      s3.fault = undefined;
    }
    expect(await t.leftovers()).toEqual([]);
  });

  it("deletes the temporary object when S3 stored it but its answer was lost", async () => {
    const t = storeOf({ client: s3.client({ maxAttempts: 1 }) });
    s3.fault = {
      status: 500,
      after: true,
      match: (method, path) => method === "PUT" && path.includes(`${t.prefix}tmp/`),
    };
    try {
      await expect(t.store.stage(chunks("stored, answer lost"), 100)).rejects.toBeInstanceOf(
        BlobStoreUnavailable,
      );
    } finally {
      s3.fault = undefined;
    }
    expect(await t.leftovers()).toEqual([]);
  });

  it("does not copy bytes it already holds: commit only deletes the temporary object", async () => {
    const t = storeOf();
    await (await t.store.stage(chunks("twice"), 100)).commit();
    t.calls.length = 0;
    await (await t.store.stage(chunks("twice"), 100)).commit();
    expect(t.calls).toEqual(["PutObject", "HeadObject", "DeleteObject"]);
  });

  it("copies a blob larger than one CopyObject may copy in parts (UploadPartCopy)", async () => {
    const t = storeOf({ maxCopyBytes: MiB, copyPartBytes: 5 * MiB });
    const data = Buffer.concat(mebibytes(12));
    const staged = await t.store.stage(chunks(data), 100 * MiB);
    t.calls.length = 0;
    await staged.commit();
    expect(t.calls.filter((c) => c === "UploadPartCopy")).toHaveLength(3);
    expect(t.calls).not.toContain("CopyObject");
    expect(sha(await readAll(t.store.read(staged.sha256)))).toBe(sha(data));
    expect(await t.leftovers()).toEqual([]);
  });

  it("fails a download cut short by S3 on the stream, as unavailable", async () => {
    const t = storeOf({ client: s3.client({ maxAttempts: 1 }) });
    const staged = await t.store.stage(chunks("some bytes"), 100);
    await staged.commit();
    s3.fault = {
      status: 503,
      match: (method, path) => method === "GET" && path.includes(t.prefix),
    };
    try {
      await expect(readAll(t.store.read(staged.sha256))).rejects.toBeInstanceOf(
        BlobStoreUnavailable,
      );
    } finally {
      s3.fault = undefined;
    }
  });

  it("fails a range download answered with the whole object (200, no Content-Range) as unavailable", async () => {
    const t = storeOf();
    const staged = await t.store.stage(chunks("0123456789"), 100);
    await staged.commit();
    s3.ignoreRange = true;
    try {
      const error = await readAll(t.store.read(staged.sha256, { start: 4, end: 6 })).catch(
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(BlobStoreUnavailable);
      expect((error as Error).message).toMatch(/asked for bytes 4-6, got Content-Range \(none\)/);
    } finally {
      s3.ignoreRange = false;
    }
    expect((await readAll(t.store.read(staged.sha256, { start: 4, end: 6 }))).toString()).toBe(
      "456",
    );
  });

  describe("downloads whose readers stall", () => {
    const sockets = 4;
    let data: Buffer;
    beforeAll(() => {
      // More than a socket's and a stream's buffers hold: a download that
      // nobody reads stays open, its socket taken.
      data = Buffer.concat(mebibytes(16));
    });

    it("are ended after the idle timeout, as unavailable, and free their sockets", async () => {
      // One client for everything, as few sockets as downloads.
      const t = storeOf({ client: s3.client({ maxSockets: sockets }), readIdleMs: 300 });
      const staged = await t.store.stage(chunks(data), 100 * MiB);
      await staged.commit();
      const stalled = Array.from({ length: sockets }, () => t.store.read(staged.sha256));
      const ended = stalled.map(ending);
      // has() waits for a socket until the stalled downloads give theirs up.
      expect(await within(3000, t.store.has(staged.sha256))).toBe(true);
      for (const error of (await within(1000, Promise.all(ended))) as unknown[]) {
        expect(error).toBeInstanceOf(BlobStoreUnavailable);
        expect((error as Error).message).toMatch(
          /^S3 GetObject failed: TimeoutError: no bytes moved for 300 ms/,
        );
      }
    });

    it("never make the other calls wait for a socket: GetObject has a client of its own", async () => {
      const t = storeOf({
        client: s3.client({ maxSockets: sockets }),
        readClient: s3.client({ maxSockets: sockets }),
      });
      const staged = await t.store.stage(chunks(data), 100 * MiB);
      await staged.commit();
      const stalled = Array.from({ length: sockets + 1 }, () => t.store.read(staged.sha256));
      try {
        // Give the downloads time to take every socket they may.
        await new Promise((resolve) => setTimeout(resolve, 200));
        expect(await within(2000, t.store.has(staged.sha256))).toBe(true);
        expect(await within(2000, t.store.has(sha("absent")))).toBe(false);
      } finally {
        for (const s of stalled) s.destroy();
      }
    });
  });

  it("gives the coordinator's control calls a socket timeout, and GetObject a client of its own without one", async () => {
    const config = s3ClientConfig(s3.env);
    expect(config.requestHandler).toMatchObject({ socketTimeout: 30_000 });
    const { client, readClient } = createS3Clients(s3.env);
    try {
      expect(readClient).not.toBe(client);
      // Separate handlers, hence separate agents and sockets.
      expect(readClient.config.requestHandler).not.toBe(client.config.requestHandler);
    } finally {
      client.destroy();
      readClient.destroy();
    }
  });

  it("fails has() as unavailable within its timeout when S3 accepts the connection and never answers", async () => {
    const silent = await silentServer();
    try {
      const t = createS3BlobStore({
        client: s3.client({ maxAttempts: 1, endpoint: silent.url }),
        bucket: s3.bucket,
        prefix: "silent/",
        requestTimeoutMs: 300,
      });
      const error = await within(
        3000,
        t.has(sha("x")).catch((e: unknown) => e),
      );
      expect(error).toBeInstanceOf(BlobStoreUnavailable);
      expect((error as Error).message).toMatch(/^S3 HeadObject failed/);
      await t.close?.();
    } finally {
      await silent.close();
    }
  });

  it("destroys both its clients on close()", async () => {
    const client = s3.client();
    const readClient = s3.client();
    const destroyed = [vi.spyOn(client, "destroy"), vi.spyOn(readClient, "destroy")];
    const store = createS3BlobStore({ client, readClient, bucket: s3.bucket, prefix: "close/" });
    await store.close?.();
    for (const spy of destroyed) expect(spy).toHaveBeenCalledOnce();
  });

  describe("with the endpoint unreachable", () => {
    it("fails stage, has and read with an error clients see as unavailable, without the endpoint", async () => {
      const port = await freePort();
      const dead = createS3BlobStore({
        client: s3.client({ maxAttempts: 1, endpoint: `http://127.0.0.1:${port}` }),
        bucket: s3.bucket,
        prefix: "dead/",
      });
      const toClient = createErrorMapper(toTask);
      const errors = [
        await dead.stage(chunks("x"), 100).catch((e: unknown) => e),
        await dead.has(sha("x")).catch((e: unknown) => e),
        await readAll(dead.read(sha("x"))).catch((e: unknown) => e),
      ];
      for (const error of errors) {
        expect(error).toBeInstanceOf(BlobStoreUnavailable);
        expect((error as Error).message).toMatch(/^S3 \w+ failed: ECONNREFUSED/);
        const { error: sent, unexpected } = toClient(error);
        expect(unexpected).toBe(false);
        expect(sent.code).toBe(Code.Unavailable);
        expect(sent.rawMessage).toBe("the artifact store is unavailable for a moment; retry");
        expect(sent.metadata.get("retry-after")).toBe("1");
      }
    });
  });
});
