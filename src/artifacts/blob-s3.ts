import { randomUUID } from "node:crypto";
import type { S3Client } from "@aws-sdk/client-s3";
import { s3Bucket } from "./blob-s3-calls.js";
import { copyObject } from "./blob-s3-copy.js";
import { readObject } from "./blob-s3-read.js";
import { removeAbandonedUploads } from "./blob-s3-sweep.js";
import { uploadObject } from "./blob-s3-upload.js";
import type { BlobStore } from "./blob-store.js";
import { countingHash } from "./counting-hash.js";

// The module `--blob-store s3://…` loads (blob-stores.ts); its parts:
// blob-s3-calls.ts (calls and their failures), -upload.ts (staging),
// -copy.ts (commit), -read.ts (downloads), -sweep.ts (removeAbandoned),
// -config.ts (clients from the environment, the start-up check).
export { checkS3Bucket, createS3Clients, s3ClientConfig } from "./blob-s3-config.js";
export { nextPartBytes } from "./blob-s3-upload.js";

const MiB = 1024 * 1024;
/** S3's limit of 5 GiB per CopyObject and per part. */
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
  const limits = {
    maxCopyBytes: options.maxCopyBytes ?? fiveGiB,
    copyPartBytes: options.copyPartBytes ?? 1024 * MiB,
  };
  const readClient = options.readClient ?? client;
  const readIdleMs = options.readIdleMs ?? 60_000;
  const abandonedAfterMs = options.abandonedAfterMs ?? 60 * 60 * 1000;
  const s3 = s3Bucket(client, bucket, prefix, options.requestTimeoutMs ?? 30_000);
  const keyOf = (sha: string) => `${prefix}sha256/${sha}`;

  return {
    async stage(source, maxBytes) {
      const tempKey = `${prefix}tmp/${randomUUID()}`;
      const bytes = countingHash(source, maxBytes);
      await uploadObject(s3, tempKey, bytes, partBytes);
      const sha256 = bytes.sha256();
      const size = bytes.size;
      return {
        sha256,
        size,
        async commit(options = {}) {
          const target = keyOf(sha256);
          // The same bytes stored before: keep that copy (unless it is corrupt).
          if (options.replace || !(await s3.exists(target))) {
            await copyObject(s3, tempKey, target, size, limits);
          }
          await s3.deleteObject(tempKey);
        },
        async discard() {
          await s3.deleteObject(tempKey);
        },
      };
    },
    read: (sha256, range) => readObject(readClient, bucket, keyOf(sha256), range, readIdleMs),
    has: (sha256) => s3.exists(keyOf(sha256)),
    removeAbandoned: () => removeAbandonedUploads(s3, Date.now() - abandonedAfterMs),
    async remove(sha256) {
      await s3.deleteObject(keyOf(sha256));
    },
    async close() {
      client.destroy();
      if (readClient !== client) readClient.destroy();
    },
  };
}
