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
