import { createHash } from "node:crypto";
import { DomainError } from "../core/errors.js";

/**
 * The refusal of an upload over `--max-artifact-bytes`: `resource_exhausted`
 * with ARTIFACT_TOO_LARGE, whether the declared size says so before the
 * first byte (uploads.ts) or the bytes themselves do (countingHash).
 */
export function tooLarge(maxBytes: number): DomainError {
  return new DomainError(
    "resource_exhausted",
    "ARTIFACT_TOO_LARGE",
    `the artifact is larger than the limit of ${maxBytes} bytes`,
  );
}

/** The bytes of an upload as a blob store receives them: counted, capped and hashed. */
export interface CountingHash<T extends Uint8Array = Uint8Array> extends AsyncIterable<T> {
  /** Bytes passed on so far. */
  readonly size: number;
  /** The SHA-256 (lowercase hex) of every byte passed on; call it once the bytes have ended. */
  sha256(): string;
}

/**
 * Passes on the chunks of `source` as they come, counting and hashing them:
 * the one place every blob store (files, PostgreSQL, S3) enforces the size
 * cap and learns an upload's digest. The chunk that takes the total over
 * `maxBytes` is not passed on: iterating throws `tooLarge` instead, as soon
 * as it arrives, so that no store writes a byte past the limit. Iterate it
 * once. Without a cap it hashes stored bytes as they are read (verify.ts).
 */
export function countingHash<T extends Uint8Array>(
  source: AsyncIterable<T>,
  maxBytes = Number.POSITIVE_INFINITY,
): CountingHash<T> {
  const hash = createHash("sha256");
  let size = 0;
  return {
    get size() {
      return size;
    },
    sha256: () => hash.digest("hex"),
    async *[Symbol.asyncIterator]() {
      for await (const chunk of source) {
        size += chunk.byteLength;
        if (size > maxBytes) throw tooLarge(maxBytes);
        hash.update(chunk);
        yield chunk;
      }
    },
  };
}
