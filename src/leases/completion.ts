import { createHash } from "node:crypto";
import { canonicalJson } from "../core/canonical-json.js";
import type { LeaseRef } from "../core/lease-ref.js";
import type { ArtifactRefJson } from "../db/schema/index.js";

/** A completion of an attempt: the lease it names and its manifest. */
export interface Completion extends LeaseRef {
  result: ArtifactRefJson | null;
  summary: string;
  metrics: Record<string, number>;
  /** The small structured result (result_value), if any. */
  value?: Record<string, unknown> | null;
}

/** The manifest identity of a completion: a repeat with the same hash is the same completion. */
export function completionHash(c: Completion): string {
  // Most completions carry no manifest at all (a drain's): their hash is one
  // constant, worked out once.
  if (c.result === null && c.summary === "" && c.value == null && isEmpty(c.metrics)) {
    emptyHash ??= manifestHash({ ...c, metrics: {} });
    return emptyHash;
  }
  return manifestHash(c);
}

let emptyHash: string | undefined;

/** Whether a metrics map holds no entry. */
export function isEmpty(record: Record<string, number>): boolean {
  for (const _ in record) return false;
  return true;
}

function manifestHash(c: Completion): string {
  return createHash("sha256")
    .update(
      canonicalJson({
        result: c.result,
        summary: c.summary,
        metrics: c.metrics,
        // Only when sent: a completion without one hashes as it did before result values.
        ...(c.value != null && { value: c.value }),
      }),
    )
    .digest("hex");
}
