import type { Config } from "../config.js";
import { invalid } from "../core/errors.js";
import { type LeaseRef, parseLeaseRef } from "../core/lease-ref.js";
import type { ArtifactKindName, ArtifactRow } from "../db/schema/index.js";
import type { Logger } from "../log.js";
import type { Metrics } from "../metrics/metrics.js";
import type { BlobStore } from "./blob-store.js";
import { tooLarge } from "./counting-hash.js";
import type { ArtifactStore } from "./store.js";

/** What storing an upload uses. */
export interface UploadDeps {
  config: Pick<Config, "maxArtifactBytes">;
  /** `isCorrupt`: whether stored bytes of the same hash are to be replaced (verify.ts). */
  artifacts: Pick<ArtifactStore, "checkLease" | "insert"> &
    Partial<Pick<ArtifactStore, "isCorrupt">>;
  blobs: Pick<BlobStore, "stage" | "has">;
  /** Where a temporary copy that could not be removed is mentioned. */
  log?: Pick<Logger, "warn">;
  /** Counts the bytes of accepted uploads. */
  metrics?: Pick<Metrics, "artifactBytesIn">;
}

/** What an upload says about itself, from an UploadArtifact header or PUT headers. */
export interface UploadHeader {
  taskId: string;
  workerId: string;
  attempt: number;
  leaseToken: string;
  filename: string;
  contentType: string;
  kind: ArtifactKindName | undefined;
  sha256: string;
  sizeBytes: number | undefined;
}

const filenamePattern = /^[A-Za-z0-9._-]{1,255}$/;

/** `[A-Za-z0-9._-]`, 1–255 characters, no leading dot: metadata only, never a path. */
export function validFilename(name: string): string {
  if (!filenamePattern.test(name) || name.startsWith(".")) {
    throw invalid(
      "filename must be 1–255 characters of [A-Za-z0-9._-] and must not start with a dot",
      "INVALID_FILENAME",
    );
  }
  return name;
}

/**
 * Stores an upload: the lease is checked before the first byte, the bytes
 * stream to a temporary file and are hashed on the way, a declared sha256 or
 * size must match, then the blob is made durable and the row committed with
 * the lease checked again in the same transaction. On any refusal nothing is
 * kept (a blob already made durable for other rows stays, shared), or at
 * worst a temporary copy the store could not remove: the refusal is still
 * the error reported, and the store's own cleanup takes the copy (at
 * start-up, removeAbandoned, or the S3 bucket's lifecycle rule).
 */
export async function storeUpload(
  app: UploadDeps,
  header: UploadHeader,
  source: AsyncIterable<Uint8Array>,
): Promise<ArtifactRow> {
  const filename = validFilename(header.filename);
  if (header.contentType.length > 256) throw invalid("content_type is longer than 256 characters");
  if (header.sha256 !== "" && !/^[0-9a-f]{64}$/.test(header.sha256)) {
    throw invalid("sha256 must be 64 lowercase hex digits");
  }
  if (
    header.sizeBytes !== undefined &&
    (header.sizeBytes < 0 || !Number.isSafeInteger(header.sizeBytes))
  ) {
    throw invalid("size_bytes must not be negative");
  }
  const maxBytes = app.config.maxArtifactBytes;
  if (header.sizeBytes !== undefined && header.sizeBytes > maxBytes) {
    throw tooLarge(maxBytes);
  }
  let lease: LeaseRef | null = null;
  let kind = header.kind;
  if (header.taskId === "") {
    kind ??= "INPUT";
    if (kind !== "INPUT") throw invalid("an artifact without task_id must be of kind INPUT");
  } else {
    kind ??= "OUTPUT";
    if (kind === "INPUT") throw invalid("a task artifact must be of kind OUTPUT or CHECKPOINT");
    lease = parseLeaseRef(header);
    await app.artifacts.checkLease(lease);
  }
  const staged = await app.blobs.stage(source, maxBytes);
  let committed = false;
  try {
    if (header.sha256 !== "" && header.sha256 !== staged.sha256) {
      throw invalid(
        `sha256 mismatch: the bytes received hash to ${staged.sha256}`,
        "CHECKSUM_MISMATCH",
      );
    }
    if (header.sizeBytes !== undefined && header.sizeBytes !== staged.size) {
      throw invalid(
        `size mismatch: ${staged.size} bytes received, ${header.sizeBytes} declared`,
        "SIZE_MISMATCH",
      );
    }
    // Bytes found corrupt under this hash are replaced by these good ones.
    const replace = staged.size > 0 && ((await app.artifacts.isCorrupt?.(staged.sha256)) ?? false);
    await staged.commit({ replace });
    committed = true;
    const row = await app.artifacts.insert(
      {
        taskId: lease?.taskId ?? null,
        attempt: lease?.attempt ?? 0,
        workerId: lease?.workerId ?? null,
        filename,
        contentType: header.contentType,
        kind,
        sha256: staged.sha256,
        sizeBytes: staged.size,
      },
      lease,
      // An empty artifact needs no bytes (reachable.ts).
      staged.size > 0 ? () => app.blobs.has(staged.sha256) : undefined,
      replace,
    );
    app.metrics?.artifactBytesIn.inc(staged.size);
    return row;
  } finally {
    if (!committed) {
      await staged.discard().catch((error: unknown) => {
        app.log?.warn({ err: error }, "removing the temporary copy of a refused upload failed");
      });
    }
  }
}
