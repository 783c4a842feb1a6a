import { Readable } from "node:stream";
import { DomainError } from "../core/errors.js";
import type { Logger } from "../log.js";
import type { Metrics } from "../metrics/metrics.js";
import type { BlobStore } from "./blob-store.js";
import { BlobStoreUnavailable, storageFailure } from "./blob-unavailable.js";
import { countingHash } from "./counting-hash.js";
import type { ArtifactStore } from "./store.js";

/** What verified reads use: the bytes, the corrupt marks, where a finding is told. */
export interface VerifyDeps {
  blobs: Pick<BlobStore, "read" | "has">;
  artifacts: Pick<ArtifactStore, "isCorrupt" | "markCorrupt">;
  log?: Pick<Logger, "error">;
  metrics?: Pick<Metrics, "corruptBlobs">;
}

/** The bytes of one artifact, as a download names them. */
export interface StoredBytes {
  /** The artifact's id, for the message and the log. */
  id: string;
  sha256: string;
  sizeBytes: number;
}

/** The refusal of bytes that do not hash to their sha256: `data_loss`, until uploaded again. */
export function corrupt(bytes: StoredBytes): DomainError {
  return new DomainError(
    "data_loss",
    "ARTIFACT_CORRUPT",
    `the stored bytes of artifact ${bytes.id} do not hash to its sha256 (a storage fault): upload them again`,
  );
}

/**
 * Refuses, before the first byte, bytes already found corrupt (`data_loss`).
 * Called where a download starts, with assertReachable.
 */
export async function assertNotCorrupt(deps: VerifyDeps, bytes: StoredBytes): Promise<void> {
  if (bytes.sizeBytes > 0 && (await deps.artifacts.isCorrupt(bytes.sha256))) {
    throw corrupt(bytes);
  }
}

/**
 * Reads stored bytes, `start`..`end` of them when a range is given, hashing
 * the whole blob on the way: bytes that do not hash to their sha256 (or have
 * another length) end the stream with `data_loss` before its last chunk is
 * given, so that no reader ever gets corrupt bytes as a complete, good
 * answer — an HTTP download is cut short of its Content-Length, an RPC
 * stream ends with the error. The finding is recorded (the blob marked
 * corrupt: later downloads are refused at once, until the same bytes are
 * uploaded again), logged and counted (meshwork_artifact_corrupt_total).
 *
 * A range reads the whole blob (the bytes before it are hashed and dropped,
 * the ones after hashed): a check of part of the bytes would need a digest
 * of each part, which the stores do not keep. A failure to read is the
 * store's (`unavailable`), not a corruption.
 */
export function verifiedRead(
  deps: VerifyDeps,
  bytes: StoredBytes,
  range?: { start: number; end: number },
): Readable {
  const start = range?.start ?? 0;
  const end = range?.end ?? bytes.sizeBytes - 1;
  async function* read(): AsyncGenerator<Buffer> {
    const source = deps.blobs.read(bytes.sha256);
    const hashed = countingHash(source as AsyncIterable<Buffer>);
    let at = 0;
    // The last chunk of the range, given only once the whole blob checked out.
    let held: Buffer | undefined;
    try {
      for await (const chunk of hashed) {
        const from = Math.max(start - at, 0);
        const to = Math.min(end + 1 - at, chunk.byteLength);
        at += chunk.byteLength;
        if (to > from) {
          if (held) yield held;
          held = chunk.subarray(from, to);
        }
      }
    } catch (error) {
      throw storageFailure("reading", error);
    } finally {
      source.destroy();
    }
    const actual = hashed.sha256();
    if (actual !== bytes.sha256 || hashed.size !== bytes.sizeBytes) {
      // The copy read may have been replaced meanwhile by good bytes (an
      // upload repairing it): only what is stored now is marked corrupt.
      const now = await hashStored(deps.blobs, bytes.sha256).catch(() => undefined);
      if (now !== "missing" && now?.actual === bytes.sha256 && now.bytes === bytes.sizeBytes) {
        throw new BlobStoreUnavailable(
          "the stored bytes were replaced while they were read: read them again",
        );
      }
      await found(deps, bytes, actual);
      throw corrupt(bytes);
    }
    if (held) yield held;
  }
  return Readable.from(read(), { objectMode: false });
}

/** Records a corrupt blob: marked, logged once, counted. */
export async function found(deps: VerifyDeps, bytes: StoredBytes, actual: string): Promise<void> {
  deps.metrics?.corruptBlobs.inc();
  deps.log?.error(
    { artifact_id: bytes.id, sha256: bytes.sha256, actual_sha256: actual },
    "stored artifact bytes are corrupt: they do not hash to their sha256",
  );
  await deps.artifacts.markCorrupt(bytes.sha256).catch(() => {
    // The refusal stands; the mark is tried again on the next read.
  });
}

/**
 * Hashes one stored blob to its end: its actual sha256 and length, or
 * "missing" when this coordinator's store does not hold it.
 */
export async function hashStored(
  blobs: Pick<BlobStore, "read" | "has">,
  sha256: string,
): Promise<{ actual: string; bytes: number } | "missing"> {
  if (!(await blobs.has(sha256))) return "missing";
  const source = blobs.read(sha256);
  const hashed = countingHash(source as AsyncIterable<Buffer>);
  try {
    for await (const _ of hashed);
  } catch (error) {
    throw storageFailure("reading", error);
  } finally {
    source.destroy();
  }
  return { actual: hashed.sha256(), bytes: hashed.size };
}
