import { DomainError } from "../core/errors.js";
import { causeChain } from "../db/faults.js";

/**
 * The blob store could not be reached or could not do what was asked just
 * now: a network failure, a 5xx answer, throttling, a connection cut half-way
 * through a download. Clients see `unavailable` (503) with a generic message
 * and retry (rpc/errors.ts); the message here and its `cause` (the storage
 * client's error) go to the log only. Never thrown for a refusal of the
 * request itself (too large, wrong checksum): those are DomainErrors.
 */
export class BlobStoreUnavailable extends Error {
  override readonly name = "BlobStoreUnavailable";
}

/** errno codes that mean the disk (or the user's quota) has no room left. */
const fullCodes = new Set(["ENOSPC", "EDQUOT"]);

/** Whether `error`, or one of its causes, says the storage is out of space (a file system's ENOSPC or EDQUOT, PostgreSQL's 53100). */
export function isStorageFull(error: unknown): boolean {
  for (const { code } of causeChain(error)) {
    if (typeof code === "string" && (fullCodes.has(code) || code === "53100")) return true;
  }
  return false;
}

/**
 * The refusal of an upload the storage has no room for: `resource_exhausted`
 * (HTTP 507 on the byte routes), to be sent again once space is freed. Its
 * bytes were not kept.
 */
export function storageFull(what = "the artifact store"): DomainError {
  return new DomainError(
    "resource_exhausted",
    "STORAGE_FULL",
    `${what} has no space left; nothing was kept: retry once space is freed`,
    { retryAfterMs: 60_000 },
  );
}

/**
 * A file system failure of the blob store as a client should see it: out of
 * space → storageFull(); anything else (EIO, EROFS, a permission changed
 * under it) → BlobStoreUnavailable (`unavailable`, retry), with the cause
 * for the log only.
 */
export function storageFailure(what: string, error: unknown): Error {
  if (error instanceof DomainError || error instanceof BlobStoreUnavailable) return error;
  if (isStorageFull(error)) return storageFull();
  return new BlobStoreUnavailable(`blob store: ${what} failed`, { cause: error });
}
