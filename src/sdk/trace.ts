import type { Claim } from "../../gen/meshwork/v1/lease_pb.js";

// W3C trace context (https://www.w3.org/TR/trace-context/) as the SDK needs
// it: it passes a claim's context on and tells its trace id. Its own copy of
// the traceparent check, because the SDK imports nothing of the coordinator.

/**
 * The W3C trace headers of a call made for a claimed task: the claim's
 * `traceparent` and `tracestate`, so that the coordinator logs (and traces)
 * the call in the task's trace. None for a claim without one.
 */
export function traceHeaders(
  claim: Pick<Claim, "traceparent" | "tracestate">,
): Record<string, string> {
  const headers: Record<string, string> = {};
  if (claim.traceparent) headers.traceparent = claim.traceparent;
  if (claim.traceparent && claim.tracestate) headers.tracestate = claim.tracestate;
  return headers;
}

const traceparentPattern = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;
const zeroTraceId = "0".repeat(32);
const zeroSpanId = "0".repeat(16);

/**
 * The trace id of a valid `traceparent`, else "". Version 00 has exactly
 * four fields, a later version may add some; version ff, an all-zero trace
 * or parent id, or uppercase hex are invalid (W3C).
 */
export function traceIdOf(traceparent: string): string {
  if (!traceparent || traceparent.length > 512) return "";
  const m = traceparentPattern.exec(traceparent.trim());
  if (!m) return "";
  const [, version, traceId = "", parentId, , rest] = m;
  if (version === "ff" || (version === "00" && rest !== undefined)) return "";
  if (traceId === zeroTraceId || parentId === zeroSpanId) return "";
  return traceId;
}
