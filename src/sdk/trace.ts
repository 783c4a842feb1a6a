import type { Claim } from "../../gen/meshwork/v1/lease_pb.js";

// W3C trace context (https://www.w3.org/TR/trace-context/) as the SDK needs
// it: it passes a claim's context on and tells its trace id. The traceparent
// check lives here, not in tracing/, because the SDK imports nothing of the
// coordinator; the coordinator imports it from here.

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

/** What a valid `traceparent` holds. */
export interface TraceParent {
  traceId: string;
  parentId: string;
  flags: string;
}

/**
 * Parses a `traceparent` header; undefined when it is not valid. Version 00
 * must have exactly four fields; a later version may add fields after them
 * (read as version 00, as W3C asks). Version ff, an all-zero trace id or
 * parent id, or uppercase hex are invalid. An invalid header is ignored,
 * never refused: W3C says a receiver starts a new trace instead. The
 * coordinator's tracing/context.ts uses this one check too.
 */
export function parseTraceparent(value: string | undefined): TraceParent | undefined {
  if (!value || value.length > 512) return undefined;
  const m = traceparentPattern.exec(value.trim());
  if (!m) return undefined;
  // The four groups always match when the pattern does; the defaults only type them.
  const [, version = "", traceId = "", parentId = "", flags = "", rest] = m;
  if (version === "ff") return undefined;
  if (version === "00" && rest !== undefined) return undefined;
  if (traceId === zeroTraceId || parentId === zeroSpanId) return undefined;
  return { traceId, parentId, flags };
}

/** The trace id of a valid `traceparent`, else "". */
export function traceIdOf(traceparent: string): string {
  return parseTraceparent(traceparent)?.traceId ?? "";
}
