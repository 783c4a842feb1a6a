import {
  AbortMultipartUploadCommand,
  DeleteObjectCommand,
  HeadObjectCommand,
  type S3Client,
} from "@aws-sdk/client-s3";
import { BlobStoreUnavailable } from "./blob-unavailable.js";

/**
 * One bucket and prefix as the S3 blob store's parts use them: every call
 * but GetObject goes through `client`, and every failure becomes
 * BlobStoreUnavailable naming the operation (clients: `unavailable`).
 */
export interface S3Bucket {
  client: S3Client;
  bucket: string;
  /** Key prefix: "" or ending in "/" (config.ts). */
  prefix: string;
  /** For the calls without a body: a deadline, the wait for a socket included. */
  deadline(): { abortSignal: AbortSignal };
  /** Runs one S3 call; any failure becomes BlobStoreUnavailable naming the operation. */
  send<T>(op: string, call: () => Promise<T>): Promise<T>;
  /** Whether an object exists (HeadObject; a 404 is false). */
  exists(key: string): Promise<boolean>;
  deleteObject(key: string): Promise<void>;
  /** Aborts a multipart upload, best effort: the error that led here is the one reported. */
  abandon(key: string, uploadId: string | undefined): Promise<void>;
}

/** The calls of one bucket; `requestTimeoutMs` bounds those without a body. */
export function s3Bucket(
  client: S3Client,
  bucket: string,
  prefix: string,
  requestTimeoutMs: number,
): S3Bucket {
  const deadline = () => ({ abortSignal: AbortSignal.timeout(requestTimeoutMs) });
  async function send<T>(op: string, call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (error) {
      throw unavailable(op, error);
    }
  }
  return {
    client,
    bucket,
    prefix,
    deadline,
    send,
    async exists(key) {
      try {
        await client.send(new HeadObjectCommand({ Bucket: bucket, Key: key }), deadline());
        return true;
      } catch (error) {
        if (statusOf(error) === 404) return false;
        throw unavailable("HeadObject", error);
      }
    },
    async deleteObject(key) {
      await send("DeleteObject", () =>
        client.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }), deadline()),
      );
    },
    async abandon(key, uploadId) {
      await client
        .send(
          new AbortMultipartUploadCommand({ Bucket: bucket, Key: key, UploadId: uploadId }),
          deadline(),
        )
        .catch(() => {});
    },
  };
}

/** The HTTP status of an S3 client error, if it has one. */
export function statusOf(error: unknown): number | undefined {
  return (error as { $metadata?: { httpStatusCode?: number } } | null)?.$metadata?.httpStatusCode;
}

/**
 * An S3 client's error as BlobStoreUnavailable, its message a short
 * summary (operation, error name or code, status) for the log; the error
 * itself is the cause. Already wrapped: as it is.
 */
export function unavailable(op: string, error: unknown): BlobStoreUnavailable {
  if (error instanceof BlobStoreUnavailable) return error;
  const e = error as { name?: string; code?: string; message?: string } | null;
  const status = statusOf(error);
  const what = e?.code ?? e?.name ?? "error";
  return new BlobStoreUnavailable(
    `S3 ${op} failed: ${what}${status ? ` (HTTP ${status})` : ""}: ${(e?.message ?? String(error)).split("\n")[0]}`,
    { cause: error },
  );
}
