import type * as http from "node:http";
import type * as http2 from "node:http2";

const grpcTimeoutUnitMs: Record<string, number> = {
  H: 3_600_000,
  M: 60_000,
  S: 1000,
  m: 1,
  u: 0.001,
  n: 0.000_001,
};

/**
 * A client's deadline (connect-timeout-ms, grpc-timeout; gRPC-Web uses the
 * latter) is cut to maxMs: a call holds a handler and maybe a long poll, so
 * no client may ask to be served for longer. Rewritten in the request's
 * headers, which connect-node reads next. A call without a deadline keeps
 * none: streams (WatchTask, StreamLeases) are long by design, and unary
 * calls are bounded by the services themselves (ClaimTasks waits ≤ 30 s).
 * Malformed values are left for connect-node to refuse.
 */
export function clampDeadline(
  req: http.IncomingMessage | http2.Http2ServerRequest,
  maxMs: number,
): void {
  const headers = req.headers;
  const connect = headers["connect-timeout-ms"];
  if (typeof connect === "string" && /^\d{1,10}$/.test(connect) && Number(connect) > maxMs) {
    headers["connect-timeout-ms"] = String(maxMs);
  }
  const grpc = headers["grpc-timeout"];
  const m = typeof grpc === "string" ? /^(\d{1,8})([HMSmun])$/.exec(grpc) : null;
  if (m && Number(m[1]) * (grpcTimeoutUnitMs[m[2] ?? ""] ?? 0) > maxMs) {
    // grpc-timeout has at most 8 digits; maxTimeoutMs is at most 86_400_000.
    headers["grpc-timeout"] = maxMs < 1e8 ? `${maxMs}m` : `${Math.floor(maxMs / 1000)}S`;
  }
}
