import { Code, ConnectError } from "@connectrpc/connect";
import type { ArtifactRow } from "../db/schema/index.js";
import type { BlobStore } from "./blob-store.js";

/**
 * Refuses, with `unavailable` (503) and a message that says why, to serve
 * an artifact whose row exists but whose bytes this coordinator's blob
 * store does not hold: a replica that does not share the blob store of the
 * one that stored them. Checked before the first byte, so a client gets an
 * answer instead of a connection cut after the headers.
 */
export async function assertReachable(
  blobs: Pick<BlobStore, "has">,
  row: ArtifactRow,
): Promise<void> {
  if (row.sizeBytes === 0 || (await blobs.has(row.sha256))) return;
  throw new ConnectError(
    `the bytes of artifact ${row.id} are not in this coordinator's blob store: replicas must share one (see the README, several replicas)`,
    Code.Unavailable,
  );
}
