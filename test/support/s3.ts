import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Readable } from "node:stream";
import {
  CreateBucketCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
  S3Client,
} from "@aws-sdk/client-s3";

/** s3rver's store, as far as the additions below use it (lib/stores/filesystem.js). */
interface S3rverStore {
  getResourcePath(bucket: string, key: string | undefined, resource: string): string;
  getObject(
    bucket: string,
    key: string,
    range: { start: number; end: number },
  ): Promise<{ content: Readable | null } | null>;
  putPart(
    bucket: string,
    uploadId: string,
    partNumber: number,
    content: Readable,
  ): Promise<{ md5: string }>;
}

/** The part of Koa's context the additions use. */
interface KoaContext {
  method: string;
  path: string;
  query: Record<string, string | undefined>;
  headers: Record<string, string | undefined>;
  status: number;
  body: unknown;
  set(name: string, value: string): void;
  store: S3rverStore;
}
type Middleware = (ctx: KoaContext, next: () => Promise<void>) => Promise<void>;

interface S3rverInstance {
  middleware: Middleware[];
  run(): Promise<{ address: string; port: number }>;
  close(): Promise<void>;
}

const S3rver = createRequire(import.meta.url)("s3rver") as new (options: {
  address: string;
  port: number;
  directory: string;
  silent: boolean;
}) => S3rverInstance;

/**
 * s3rver's built-in account. s3rver checks only that a request names this
 * access key id: it does not verify SigV4 signatures (the AWS SDK's), so
 * the secret is never checked.
 */
export const s3Credentials = { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" };

/** A failure to answer instead of the real one, for the requests `match` picks. */
export interface S3Fault {
  match(method: string, path: string, query: Record<string, string | undefined>): boolean;
  status: number;
  /** Let the request do its work first, then answer the failure (an answer lost on the way). */
  after?: boolean;
}

/** What a test may set on a client of the test server. */
export interface ClientOptions {
  maxAttempts?: number;
  endpoint?: string;
  /** Sockets of the client's HTTP agent (the SDK's default: 50). */
  maxSockets?: number;
}

export interface TestS3 {
  endpoint: string;
  bucket: string;
  /** A client of this server (path style, no checksums it does not understand). */
  client(options?: ClientOptions): S3Client;
  /** The environment `--blob-store s3://…` reads to reach this server. */
  env: Record<string, string>;
  /** Keys under `prefix`. */
  keys(prefix?: string): Promise<string[]>;
  /** Multipart uploads begun and neither completed nor aborted (ListMultipartUploads). */
  openUploads(): Promise<string[]>;
  /** While set, matching requests fail with this status (S3 "InternalError" and the like). */
  fault: S3Fault | undefined;
  /** While set, GET requests are answered as if they asked for no Range (200, the whole object). */
  ignoreRange: boolean;
  close(): Promise<void>;
}

/**
 * s3rver (an S3 HTTP API emulator) on 127.0.0.1, a random port and a
 * temporary directory, with one bucket. s3rver 3.7 lacks three calls the
 * blob store makes or the tests check; they are added here, in front of its
 * router, on its own file store: AbortMultipartUpload, ListMultipartUploads
 * and UploadPartCopy. (s3rver checks no SigV4 signature, only the access
 * key id; these do not check even that.)
 */
export async function startS3(bucket = "meshwork-test"): Promise<TestS3> {
  const directory = mkdtempSync(join(tmpdir(), "meshwork-s3-"));
  const server = new S3rver({ address: "127.0.0.1", port: 0, directory, silent: true });
  const state: { fault: S3Fault | undefined; ignoreRange: boolean } = {
    fault: undefined,
    ignoreRange: false,
  };
  const uploadsDir = (ctx: KoaContext, b: string) =>
    ctx.store.getResourcePath(b, undefined, "uploads");
  const additions: Middleware = async (ctx, next) => {
    const m = /^\/([^/]+)(?:\/(.+?))?\/?$/.exec(ctx.path);
    const fault = state.fault;
    if (fault?.match(ctx.method, ctx.path, ctx.query)) {
      if (fault.after) await next();
      ctx.status = fault.status;
      ctx.body = { Error: { Code: "InternalError", Message: "injected by the test" } };
      return;
    }
    if (state.ignoreRange && ctx.method === "GET") delete ctx.headers.range;
    if (!m?.[1]) return next();
    const b = m[1];
    const key = m[2] === undefined ? undefined : decodeURIComponent(m[2]);
    if (ctx.method === "GET" && key === undefined && "uploads" in ctx.query) {
      const dir = uploadsDir(ctx, b);
      let ids: string[] = [];
      try {
        ids = readdirSync(dir);
      } catch {
        // No upload ever began in this bucket.
      }
      ctx.body = {
        ListMultipartUploadsResult: {
          Bucket: b,
          Upload: ids.map((id) => ({
            Key: readFileSync(join(dir, id, "key"), "utf8"),
            UploadId: id,
            Initiated: statSync(join(dir, id)).birthtime.toISOString(),
          })),
        },
      };
      return;
    }
    const uploadId = ctx.query.uploadId;
    if (ctx.method === "DELETE" && key !== undefined && uploadId) {
      rmSync(join(uploadsDir(ctx, b), uploadId), { recursive: true, force: true });
      ctx.status = 204;
      ctx.body = "";
      return;
    }
    const copySource = ctx.headers["x-amz-copy-source"];
    if (ctx.method === "PUT" && key !== undefined && uploadId && copySource) {
      const [, srcBucket = "", srcKey = ""] =
        /^\/?([^/]+)\/(.+)$/.exec(decodeURIComponent(copySource)) ?? [];
      const range = /^bytes=(\d+)-(\d+)$/.exec(ctx.headers["x-amz-copy-source-range"] ?? "");
      const object = await ctx.store.getObject(srcBucket, srcKey, {
        start: Number(range?.[1] ?? 0),
        end: Number(range?.[2] ?? Number.MAX_SAFE_INTEGER),
      });
      if (!object?.content) {
        ctx.status = 404;
        ctx.body = { Error: { Code: "NoSuchKey", Message: "no such source" } };
        return;
      }
      const { md5 } = await ctx.store.putPart(
        b,
        uploadId,
        Number(ctx.query.partNumber),
        object.content,
      );
      ctx.body = {
        CopyPartResult: { ETag: `"${md5}"`, LastModified: new Date().toISOString() },
      };
      return;
    }
    return next();
  };
  // After s3rver's logger and XML encoder, before its router.
  server.middleware.splice(2, 0, additions);
  const { port } = await server.run();
  const endpoint = `http://127.0.0.1:${port}`;
  // As the coordinator does (blob-s3.ts): no multi-line notice about Node 22.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= "true";
  const client = ({ maxSockets, ...options }: ClientOptions = {}) =>
    new S3Client({
      endpoint,
      region: "us-east-1",
      forcePathStyle: true,
      credentials: s3Credentials,
      requestChecksumCalculation: "WHEN_REQUIRED",
      responseChecksumValidation: "WHEN_REQUIRED",
      ...(maxSockets === undefined
        ? {}
        : { requestHandler: { httpAgent: { keepAlive: true, maxSockets } } }),
      ...options,
    });
  const admin = client();
  await admin.send(new CreateBucketCommand({ Bucket: bucket }));
  return {
    endpoint,
    bucket,
    client,
    env: {
      AWS_ENDPOINT_URL: endpoint,
      AWS_REGION: "us-east-1",
      AWS_ACCESS_KEY_ID: s3Credentials.accessKeyId,
      AWS_SECRET_ACCESS_KEY: s3Credentials.secretAccessKey,
      // Never ask an instance-metadata address for credentials.
      AWS_EC2_METADATA_DISABLED: "true",
    },
    async keys(prefix = "") {
      const r = await admin.send(new ListObjectsV2Command({ Bucket: bucket, Prefix: prefix }));
      return (r.Contents ?? []).map((o) => o.Key ?? "").sort();
    },
    async openUploads() {
      const r = await admin.send(new ListMultipartUploadsCommand({ Bucket: bucket }));
      return (r.Uploads ?? []).map((u) => u.Key ?? "");
    },
    get fault() {
      return state.fault;
    },
    set fault(f) {
      state.fault = f;
    },
    get ignoreRange() {
      return state.ignoreRange;
    },
    set ignoreRange(on) {
      state.ignoreRange = on;
    },
    async close() {
      admin.destroy();
      await server.close();
      rmSync(directory, { recursive: true, force: true });
    },
  };
}
