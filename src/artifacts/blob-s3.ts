import { createHash, randomUUID } from "node:crypto";
import { Readable } from "node:stream";
import {
  AbortMultipartUploadCommand,
  type CompletedPart,
  CompleteMultipartUploadCommand,
  CopyObjectCommand,
  CreateMultipartUploadCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  HeadBucketCommand,
  HeadObjectCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  type S3ClientConfig,
  UploadPartCommand,
  UploadPartCopyCommand,
} from "@aws-sdk/client-s3";
import { DomainError } from "../core/errors.js";
import { StartupError } from "../data-dir-lock.js";
import type { BlobStore } from "./blob-store.js";
import { BlobStoreUnavailable } from "./blob-unavailable.js";

const MiB = 1024 * 1024;
/** S3's limits: 10,000 parts per upload, 5 GiB per CopyObject and per part. */
const maxParts = 10_000;
const fiveGiB = 5 * 1024 * MiB;

/** What `createS3BlobStore` needs. */
export interface S3BlobStoreOptions {
  /** The client of every call but GetObject. */
  client: S3Client;
  /** How old an upload's leftovers under `tmp/` must be for removeAbandoned to take them (1 hour). */
  abandonedAfterMs?: number;
  /**
   * The client of GetObject (default `client`). Give it its own sockets
   * (`createS3Clients`): a download holds its socket while its reader is
   * slow, and must not make the other calls wait for one.
   */
  readClient?: S3Client;
  /**
   * How long HeadObject, DeleteObject, CreateMultipartUpload and
   * AbortMultipartUpload may take, waiting for a socket included, before
   * they fail as unavailable (default 30 s). Calls that carry or copy bytes
   * (PutObject, UploadPart, CopyObject, CompleteMultipartUpload) are bounded
   * by the client's socket timeout instead (`s3ClientConfig`): they may be
   * long, but not silent.
   */
  requestTimeoutMs?: number;
  /**
   * A download whose reader takes nothing and whose S3 response brings
   * nothing for this long is ended with an error, its socket freed
   * (default 60 s).
   */
  readIdleMs?: number;
  bucket: string;
  /** Key prefix: "" or ending in "/" (config.ts). */
  prefix: string;
  /**
   * Bytes per part of a multipart upload (default 8 MiB; S3 wants at least
   * 5 MiB for every part but the last). An upload holds at most two parts
   * in memory: one being sent, one being filled. Parts double in size
   * every 1,000 (up to 512 times this), so that S3's 10,000 parts hold
   * about 8 TB while uploads of ordinary size keep 8 MiB parts.
   */
  partBytes?: number;
  /** Largest object moved with one CopyObject (S3's limit, 5 GiB); larger ones are copied in parts. */
  maxCopyBytes?: number;
  /** Bytes per UploadPartCopy when copying in parts (default 1 GiB). */
  copyPartBytes?: number;
}

/**
 * Artifact bytes in an S3 bucket (AWS S3, MinIO, Cloudflare R2, …) under
 * `<prefix>sha256/<hex>`. An upload streams into `<prefix>tmp/<uuid>`
 * (one PutObject when it fits in one part, else a multipart upload, one
 * part in flight while the next fills) and is hashed on the way; commit
 * copies it to its hash's key and deletes the temporary object. On any
 * failure the multipart upload is aborted and the temporary object deleted.
 * S3 failures are `BlobStoreUnavailable` (clients: `unavailable`).
 *
 * Unlike the file store nothing is cleared at start-up: replicas share the
 * bucket, and another one's upload may be in flight. What a crash leaves
 * under `tmp/` (or an unfinished multipart upload) is removed by
 * removeAbandoned once an hour old (the app runs it every ten minutes); a
 * bucket lifecycle rule may expire them as well.
 */
export function createS3BlobStore(options: S3BlobStoreOptions): BlobStore {
  const { client, bucket, prefix } = options;
  const partBytes = options.partBytes ?? 8 * MiB;
  const maxCopyBytes = options.maxCopyBytes ?? fiveGiB;
  const copyPartBytes = options.copyPartBytes ?? 1024 * MiB;
  const readClient = options.readClient ?? client;
  const requestTimeoutMs = options.requestTimeoutMs ?? 30_000;
  const readIdleMs = options.readIdleMs ?? 60_000;
  /** For the calls without a body: a deadline, the wait for a socket included. */
  const deadline = () => ({ abortSignal: AbortSignal.timeout(requestTimeoutMs) });
  const abandonedAfterMs = options.abandonedAfterMs ?? 60 * 60 * 1000;
  const keyOf = (sha: string) => `${prefix}sha256/${sha}`;

  /** Runs one S3 call; any failure becomes BlobStoreUnavailable naming the operation. */
  async function send<T>(op: string, call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (error) {
      throw unavailable(op, error);
    }
  }

  async function exists(key: string): Promise<boolean> {
    try {
      await client.send(new HeadObjectCommand({ Bucket: bucket, Key: key }), deadline());
      return true;
    } catch (error) {
      if (statusOf(error) === 404) return false;
      throw unavailable("HeadObject", error);
    }
  }

  /** Copies `from` to `to` on the server: one CopyObject, or UploadPartCopy above 5 GiB. */
  async function copy(from: string, to: string, size: number): Promise<void> {
    const source = `${bucket}/${from.split("/").map(encodeURIComponent).join("/")}`;
    if (size <= maxCopyBytes) {
      await send("CopyObject", () =>
        client.send(new CopyObjectCommand({ Bucket: bucket, Key: to, CopySource: source })),
      );
      return;
    }
    const partSize = Math.max(copyPartBytes, Math.ceil(size / maxParts));
    const created = await send("CreateMultipartUpload", () =>
      client.send(new CreateMultipartUploadCommand({ Bucket: bucket, Key: to }), deadline()),
    );
    const uploadId = created.UploadId;
    try {
      const parts: CompletedPart[] = [];
      for (let start = 0, n = 1; start < size; start += partSize, n++) {
        const end = Math.min(size, start + partSize) - 1;
        const r = await send("UploadPartCopy", () =>
          client.send(
            new UploadPartCopyCommand({
              Bucket: bucket,
              Key: to,
              UploadId: uploadId,
              PartNumber: n,
              CopySource: source,
              CopySourceRange: `bytes=${start}-${end}`,
            }),
          ),
        );
        parts.push({ PartNumber: n, ETag: r.CopyPartResult?.ETag });
      }
      await send("CompleteMultipartUpload", () =>
        client.send(
          new CompleteMultipartUploadCommand({
            Bucket: bucket,
            Key: to,
            UploadId: uploadId,
            MultipartUpload: { Parts: parts },
          }),
        ),
      );
    } catch (error) {
      await client
        .send(
          new AbortMultipartUploadCommand({ Bucket: bucket, Key: to, UploadId: uploadId }),
          deadline(),
        )
        .catch(() => {});
      throw error;
    }
  }

  const deleteObject = (key: string) =>
    send("DeleteObject", () =>
      client.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }), deadline()),
    );

  return {
    async stage(source, maxBytes) {
      const tempKey = `${prefix}tmp/${randomUUID()}`;
      // The size of the part being filled: doubled every 1,000 parts.
      let partSize = partBytes;
      const hash = createHash("sha256");
      let size = 0;
      let pending: Uint8Array[] = [];
      let pendingBytes = 0;
      let uploadId: string | undefined;
      let partCount = 0;
      const parts: CompletedPart[] = [];
      // One part in flight while the next one fills: memory stays at two parts.
      let sending: Promise<void> = Promise.resolve();
      const sendPart = async (body: Buffer) => {
        if (uploadId === undefined) {
          const created = await send("CreateMultipartUpload", () =>
            client.send(
              new CreateMultipartUploadCommand({ Bucket: bucket, Key: tempKey }),
              deadline(),
            ),
          );
          uploadId = created.UploadId;
        }
        await sending;
        const PartNumber = ++partCount;
        partSize = nextPartBytes(partBytes, partCount);
        sending = send("UploadPart", () =>
          client.send(
            new UploadPartCommand({
              Bucket: bucket,
              Key: tempKey,
              UploadId: uploadId,
              PartNumber,
              Body: body,
              ContentLength: body.byteLength,
            }),
          ),
        ).then((r) => {
          parts.push({ PartNumber, ETag: r.ETag });
        });
        // Handled here, awaited before the next part: a failed part must not
        // surface as an unhandled rejection while the next one fills.
        sending.catch(() => {});
      };
      const takePending = () => {
        const body = Buffer.concat(pending, pendingBytes);
        pending = [];
        pendingBytes = 0;
        return body;
      };
      try {
        for await (const chunk of source) {
          size += chunk.byteLength;
          if (size > maxBytes) {
            throw new DomainError(
              "resource_exhausted",
              "ARTIFACT_TOO_LARGE",
              `the artifact is larger than the limit of ${maxBytes} bytes`,
            );
          }
          hash.update(chunk);
          let rest = chunk;
          while (rest.byteLength > 0) {
            // A full part is sent only once more bytes arrive: an upload that
            // fits in one part is one PutObject.
            if (pendingBytes === partSize) await sendPart(takePending());
            const take = Math.min(rest.byteLength, partSize - pendingBytes);
            pending.push(rest.subarray(0, take));
            pendingBytes += take;
            rest = rest.subarray(take);
          }
        }
        if (uploadId === undefined) {
          const body = takePending();
          await send("PutObject", () =>
            client.send(
              new PutObjectCommand({
                Bucket: bucket,
                Key: tempKey,
                Body: body,
                ContentLength: body.byteLength,
              }),
            ),
          );
        } else {
          await sendPart(takePending());
          await sending;
          parts.sort((a, b) => (a.PartNumber ?? 0) - (b.PartNumber ?? 0));
          await send("CompleteMultipartUpload", () =>
            client.send(
              new CompleteMultipartUploadCommand({
                Bucket: bucket,
                Key: tempKey,
                UploadId: uploadId,
                MultipartUpload: { Parts: parts },
              }),
            ),
          );
        }
      } catch (error) {
        // Best effort, and the first error is the one reported: the parts
        // go with the multipart upload, and the object in case a completion
        // went through without its answer arriving.
        await sending.catch(() => {});
        if (uploadId !== undefined) {
          await client
            .send(
              new AbortMultipartUploadCommand({ Bucket: bucket, Key: tempKey, UploadId: uploadId }),
              deadline(),
            )
            .catch(() => {});
        }
        await client
          .send(new DeleteObjectCommand({ Bucket: bucket, Key: tempKey }), deadline())
          .catch(() => {});
        throw error;
      }
      const sha256 = hash.digest("hex");
      return {
        sha256,
        size,
        async commit(options = {}) {
          const target = keyOf(sha256);
          // The same bytes stored before: keep that copy (unless it is corrupt).
          if (options.replace || !(await exists(target))) await copy(tempKey, target, size);
          await deleteObject(tempKey);
        },
        async discard() {
          await deleteObject(tempKey);
        },
      };
    },

    read(sha256, range) {
      const abort = new AbortController();
      let body: Readable | undefined;
      let finished = false;
      // Refreshed whenever the reader asks for more or S3 brings some: a
      // reader that stalls (or an S3 that does) cannot hold a socket forever.
      const idle = setTimeout(() => {
        fail(
          Object.assign(new Error(`no bytes moved for ${readIdleMs} ms`), { name: "TimeoutError" }),
        );
      }, readIdleMs);
      idle.unref();
      const out = new Readable({
        read() {
          idle.refresh();
          body?.resume();
        },
        destroy(error, callback) {
          finished = true;
          clearTimeout(idle);
          abort.abort();
          body?.destroy();
          callback(error);
        },
      });
      const fail = (error: unknown) => {
        if (finished) return;
        finished = true;
        out.destroy(unavailable("GetObject", error));
      };
      send("GetObject", () =>
        readClient.send(
          new GetObjectCommand({
            Bucket: bucket,
            Key: keyOf(sha256),
            Range: range ? `bytes=${range.start}-${range.end}` : undefined,
          }),
          { abortSignal: abort.signal },
        ),
      ).then((response) => {
        const stream = response.Body as Readable;
        body = stream;
        if (finished) {
          stream.destroy();
          return;
        }
        // A server that ignores Range answers 200 with the whole object:
        // its first bytes are not the ones asked for.
        if (range && !response.ContentRange?.startsWith(`bytes ${range.start}-`)) {
          stream.destroy();
          fail(
            new Error(
              `asked for bytes ${range.start}-${range.end}, got Content-Range ${response.ContentRange ?? "(none)"}`,
            ),
          );
          return;
        }
        // What the server says it sends, or what was asked: never more than
        // asked (a server that ignores part of a Range), never less (a
        // response cut short is an error, not a shorter artifact).
        let left = range ? range.end - range.start + 1 : (response.ContentLength ?? Infinity);
        stream.on("data", (data: Buffer) => {
          if (finished) return;
          idle.refresh();
          const piece = data.byteLength > left ? data.subarray(0, left) : data;
          left -= piece.byteLength;
          const more = out.push(piece);
          if (left === 0) {
            finished = true;
            clearTimeout(idle);
            out.push(null);
            stream.destroy();
          } else if (!more) stream.pause();
        });
        stream.once("end", () => {
          if (finished) return;
          if (left !== Infinity && left > 0) {
            fail(new Error(`the response ended ${left} bytes short`));
            return;
          }
          finished = true;
          clearTimeout(idle);
          out.push(null);
        });
        stream.once("error", fail);
      }, fail);
      return out;
    },

    has: (sha256) => exists(keyOf(sha256)),
    /**
     * What uploads a crash abandoned left: multipart uploads under `tmp/`
     * begun, and temporary objects written, over an hour ago (a live upload
     * of any replica is younger: its object is written when it completes,
     * and a multipart upload within the body timeout of its last part).
     */
    async removeAbandoned() {
      const cutoff = Date.now() - abandonedAfterMs;
      let removed = 0;
      let marker: { key?: string; upload?: string } = {};
      do {
        const page = await send("ListMultipartUploads", () =>
          client.send(
            new ListMultipartUploadsCommand({
              Bucket: bucket,
              Prefix: `${prefix}tmp/`,
              KeyMarker: marker.key,
              UploadIdMarker: marker.upload,
            }),
            deadline(),
          ),
        );
        for (const u of page.Uploads ?? []) {
          if (!u.Key?.startsWith(`${prefix}tmp/`) || !u.UploadId) continue;
          if ((u.Initiated?.getTime() ?? 0) > cutoff) continue;
          await send("AbortMultipartUpload", () =>
            client.send(
              new AbortMultipartUploadCommand({ Bucket: bucket, Key: u.Key, UploadId: u.UploadId }),
              deadline(),
            ),
          );
          removed++;
        }
        marker = page.IsTruncated
          ? { key: page.NextKeyMarker, upload: page.NextUploadIdMarker }
          : {};
      } while (marker.key);
      let token: string | undefined;
      do {
        const page = await send("ListObjectsV2", () =>
          client.send(
            new ListObjectsV2Command({
              Bucket: bucket,
              Prefix: `${prefix}tmp/`,
              ContinuationToken: token,
            }),
            deadline(),
          ),
        );
        for (const o of page.Contents ?? []) {
          if (!o.Key?.startsWith(`${prefix}tmp/`)) continue;
          if ((o.LastModified?.getTime() ?? 0) > cutoff) continue;
          await deleteObject(o.Key);
          removed++;
        }
        token = page.IsTruncated ? page.NextContinuationToken : undefined;
      } while (token);
      return removed;
    },

    async remove(sha256) {
      await deleteObject(keyOf(sha256));
    },

    async close() {
      client.destroy();
      if (readClient !== client) readClient.destroy();
    },
  };
}

/**
 * The size of the part after `sent` parts: `partBytes` for the first
 * 1,000, then doubled every 1,000 up to 512 times `partBytes` (4 GiB for
 * 8 MiB, under S3's 5 GiB per part); 10,000 parts hold 1,023,000 times
 * `partBytes`.
 */
export function nextPartBytes(partBytes: number, sent: number): number {
  return partBytes * 2 ** Math.min(9, Math.floor(sent / 1000));
}

/** The HTTP status of an S3 client error, if it has one. */
function statusOf(error: unknown): number | undefined {
  return (error as { $metadata?: { httpStatusCode?: number } } | null)?.$metadata?.httpStatusCode;
}

/**
 * An S3 client's error as BlobStoreUnavailable, its message a short
 * summary (operation, error name or code, status) for the log; the error
 * itself is the cause. Already wrapped: as it is.
 */
function unavailable(op: string, error: unknown): BlobStoreUnavailable {
  if (error instanceof BlobStoreUnavailable) return error;
  const e = error as { name?: string; code?: string; message?: string } | null;
  const status = statusOf(error);
  const what = e?.code ?? e?.name ?? "error";
  return new BlobStoreUnavailable(
    `S3 ${op} failed: ${what}${status ? ` (HTTP ${status})` : ""}: ${(e?.message ?? String(error)).split("\n")[0]}`,
    { cause: error },
  );
}

/**
 * The S3 client's settings from the environment: `AWS_ENDPOINT_URL_S3` or
 * `AWS_ENDPOINT_URL` (unset: AWS itself), `AWS_REGION` (default
 * `us-east-1`; `auto` for Cloudflare R2), credentials from the AWS SDK's
 * usual chain (`AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, a profile,
 * an instance role). Path-style URLs (`endpoint/bucket/key`, what MinIO
 * and most self-hosted servers need) are on whenever an endpoint is set,
 * off for AWS; `MESHWORK_S3_FORCE_PATH_STYLE=true|false` overrides.
 * Checksums are computed only where S3 requires them: several
 * S3-compatible servers do not accept the SDK's newer default ones, and
 * the bytes are checked against their SHA-256 anyway.
 */
export function s3ClientConfig(env: NodeJS.ProcessEnv = process.env): S3ClientConfig {
  // The SDK warns, in several lines on stderr, that its releases from 2027
  // on will need Node 22. The version here is pinned: nothing to do now.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= "true";
  const endpoint = env.AWS_ENDPOINT_URL_S3 || env.AWS_ENDPOINT_URL || undefined;
  let forcePathStyle = endpoint !== undefined;
  const pathStyle = env.MESHWORK_S3_FORCE_PATH_STYLE?.trim().toLowerCase();
  if (pathStyle) {
    if (["1", "true", "yes", "on"].includes(pathStyle)) forcePathStyle = true;
    else if (["0", "false", "no", "off"].includes(pathStyle)) forcePathStyle = false;
    else {
      throw new StartupError(
        `MESHWORK_S3_FORCE_PATH_STYLE must be true or false, not ${env.MESHWORK_S3_FORCE_PATH_STYLE}`,
      );
    }
  }
  return {
    region: env.AWS_REGION || "us-east-1",
    endpoint,
    forcePathStyle,
    requestChecksumCalculation: "WHEN_REQUIRED",
    responseChecksumValidation: "WHEN_REQUIRED",
    // A connection that cannot be made fails within seconds (and is
    // retried by the SDK); an established one that carries nothing for 30 s
    // fails too. Downloads, which idle while a slow client reads, use a
    // client of their own (createS3Clients) where the blob store's read
    // idle timeout applies instead.
    requestHandler: {
      connectionTimeout: 5000,
      socketTimeout: 30_000,
      httpAgent: { keepAlive: true, maxSockets: 256 },
      httpsAgent: { keepAlive: true, maxSockets: 256 },
    },
  };
}

/** Where an S3 client sends its requests, for messages: the endpoint's host, or AWS with the region. */
function whereOf(config: S3ClientConfig): string {
  if (typeof config.endpoint === "string") {
    try {
      return `the S3 endpoint ${new URL(config.endpoint).host}`;
    } catch {
      return "the S3 endpoint in AWS_ENDPOINT_URL";
    }
  }
  return `AWS S3 (region ${String(config.region)})`;
}

/**
 * At start-up: whether the bucket of `--blob-store s3://…` can be reached
 * with these settings (HeadBucket). Throws a StartupError, one line that
 * says what to fix, never with a key or a secret in it.
 */
export async function checkS3Bucket(
  bucket: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<void> {
  const config = s3ClientConfig(env);
  const client = new S3Client(config);
  const where = whereOf(config);
  try {
    await client.send(new HeadBucketCommand({ Bucket: bucket }));
  } catch (error) {
    let line = whyNoBucket(error, bucket, where);
    for (const secret of [env.AWS_SECRET_ACCESS_KEY, env.AWS_SESSION_TOKEN]) {
      if (secret) line = line.split(secret).join("***");
    }
    throw new StartupError(line);
  } finally {
    client.destroy();
  }
}

function whyNoBucket(error: unknown, bucket: string, where: string): string {
  const e = error as { name?: string; code?: string; message?: string };
  const first = (e.message ?? String(error)).split("\n")[0];
  const status = statusOf(error);
  if (e.name === "CredentialsProviderError") {
    return `no S3 credentials for --blob-store s3://${bucket}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY`;
  }
  switch (status) {
    case 404:
      return `the bucket ${bucket} does not exist at ${where}: create it, or fix --blob-store`;
    case 301:
      return `the bucket ${bucket} is in another region than ${where}: set AWS_REGION to its region`;
    case 400:
    case 403:
      return `${where} refused access to the bucket ${bucket} (HTTP ${status}): check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION`;
  }
  switch (e.code) {
    case "ECONNREFUSED":
      return `cannot reach ${where} (connection refused): is it running, on that port? (AWS_ENDPOINT_URL)`;
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return `cannot resolve the host of ${where}: check AWS_ENDPOINT_URL`;
  }
  if (e.name === "TimeoutError") return `cannot reach ${where} (timed out): check AWS_ENDPOINT_URL`;
  return `cannot use the bucket ${bucket} at ${where}: ${e.code ?? e.name ?? "error"}${status ? ` (HTTP ${status})` : ""}: ${first}`;
}

/**
 * The S3 clients of `--blob-store s3://…`, configured from the environment
 * (`s3ClientConfig`): `client` for every call but GetObject, `readClient`
 * for GetObject, each with its own sockets, so that downloads held open by
 * slow readers never make the other calls wait for a socket. The read
 * client has no socket timeout: the blob store ends downloads idle for long.
 */
export function createS3Clients(env: NodeJS.ProcessEnv = process.env): {
  client: S3Client;
  readClient: S3Client;
} {
  const config = s3ClientConfig(env);
  return {
    client: new S3Client(config),
    readClient: new S3Client({
      ...config,
      requestHandler: { ...config.requestHandler, socketTimeout: undefined },
    }),
  };
}
