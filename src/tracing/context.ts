import { randomFillSync } from "node:crypto";
import { parseTraceparent, type TraceParent } from "../sdk/trace.js";

export { parseTraceparent, type TraceParent };

const zeroTraceId = "0".repeat(32);
const zeroSpanId = "0".repeat(16);

/**
 * A request's W3C trace context (https://www.w3.org/TR/trace-context/).
 * `traceId` is the caller's when it sent a valid `traceparent`, else one
 * made for the request, so that every request (and every log line of it)
 * has a trace id. `spanId` is the request's own span: the OpenTelemetry
 * server span when spans are exported, else an id made for the request.
 */
export interface TraceContext {
  /** 32 lowercase hex digits, not all zero. */
  traceId: string;
  /** The request's span: 16 lowercase hex digits. */
  spanId: string;
  /** The caller's span (the parent id of its `traceparent`), "" when it sent none. */
  parentSpanId: string;
  /** The trace flags, 2 hex digits: "01" when sampled. */
  flags: string;
  /** The `tracestate` the caller sent when valid, else "". */
  state: string;
}

/**
 * A `tracestate` header as sent when it is valid enough to pass on: at most
 * 512 characters, printable ASCII, at most 32 comma-separated list members
 * of the form key=value. Otherwise "" (ignored, as W3C allows).
 */
export function parseTracestate(value: string | undefined): string {
  if (!value) return "";
  const v = value.trim();
  if (v.length > 512 || !/^[\x20-\x7e]*$/.test(v)) return "";
  const members = v.split(",").filter((m) => m.trim() !== "");
  if (members.length > 32) return "";
  for (const m of members)
    if (!/^\s*[a-z0-9][-_*/@a-z0-9]{0,255}=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,256}\s*$/.test(m))
      return "";
  return v;
}

/**
 * Random bytes as hex, from a pool filled 4 KiB at a time: every request
 * gets a trace id and a span id, and one randomBytes call each cost more
 * than the rest of a refused request's handling.
 */
const pool = Buffer.alloc(4096);
let poolAt = pool.length;
function randomHex(bytes: number): string {
  if (poolAt + bytes > pool.length) {
    randomFillSync(pool);
    poolAt = 0;
  }
  const hex = pool.toString("hex", poolAt, poolAt + bytes);
  poolAt += bytes;
  return hex;
}

/** 16 random hex digits, not all zero. */
export function newSpanId(): string {
  for (;;) {
    const id = randomHex(8);
    if (id !== zeroSpanId) return id;
  }
}

/** 32 random hex digits, not all zero. */
export function newTraceId(): string {
  for (;;) {
    const id = randomHex(16);
    if (id !== zeroTraceId) return id;
  }
}

/**
 * The trace context of a request from its `traceparent` and `tracestate`
 * headers: the caller's trace when valid, else a new trace (flags 00: the
 * caller recorded nothing). `tracestate` is kept only with a valid
 * `traceparent` (W3C: it means nothing alone).
 */
export function traceFromHeaders(
  traceparent: string | undefined,
  tracestate: string | undefined,
): TraceContext {
  const parent = parseTraceparent(traceparent);
  if (!parent) {
    return { traceId: newTraceId(), spanId: newSpanId(), parentSpanId: "", flags: "00", state: "" };
  }
  return {
    traceId: parent.traceId,
    spanId: newSpanId(),
    parentSpanId: parent.parentId,
    flags: parent.flags,
    state: parseTracestate(tracestate),
  };
}

/**
 * The `traceparent` to hand on from this request: its trace, with the
 * request's span as parent (a worker's calls for a task created here are
 * children of the CreateTask span).
 */
export function traceparentOf(trace: TraceContext): string {
  return `00-${trace.traceId}-${trace.spanId}-${trace.flags}`;
}

/** The trace id of a `traceparent`, or "" when it is not valid. */
export function traceIdOf(traceparent: string): string {
  return parseTraceparent(traceparent)?.traceId ?? "";
}
