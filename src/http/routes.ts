import type * as http from "node:http";
import type * as http2 from "node:http2";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";
import type { Guard } from "../auth/guard.js";
import { anonymousAdmin, type Principal } from "../auth/principal.js";
import type { TokenRoleName } from "../db/schema/index.js";
import type { Logger } from "../log.js";
import type { Correlation } from "../rpc/context.js";
import { codeName, httpStatusOfCode, type ToClientError } from "../rpc/errors.js";
import { sendJson } from "./json.js";

export type Request = http.IncomingMessage | http2.Http2ServerRequest;
export type Response = http.ServerResponse | http2.Http2ServerResponse;

/**
 * A plain HTTP route (not an RPC). Each route says who may call it, so a new
 * route cannot be added without an access rule: `roles` lists the roles
 * allowed besides admin, or "open" for routes anyone may call (health).
 */
export interface PlainRoute {
  methods: readonly string[];
  pattern: RegExp;
  roles: readonly TokenRoleName[] | "open";
  /** What the route does, for the refusal message ("download an artifact"). */
  what: string;
  /** The workers the request acts for (a worker token may act only for its own). */
  actsFor?: (req: Request) => string[];
  handle(call: {
    req: Request;
    res: Response;
    match: RegExpExecArray;
    principal: Principal;
    correlation: Correlation;
  }): Promise<void>;
}

/** A request header's first value, or "". */
export function header(req: Request, name: string): string {
  const v = req.headers[name];
  return (Array.isArray(v) ? v[0] : v) ?? "";
}

/**
 * Dispatches plain HTTP routes. Before a route runs: the bearer token, the
 * role, the rate limit and worker ownership (guard.ts), exactly as for RPCs.
 * Errors answer `{"error": "<code>", "message": "...", "reason": "..."}`
 * (reason when there is one, e.g. FOREIGN_WORKER) with the status of
 * the error table (docs/protocol.md#errors); nothing internal is shown.
 * Returns false when no route matches (the request goes on to Connect).
 */
export function createPlainRouter(
  routes: readonly PlainRoute[],
  guard: Guard,
  toClientError: ToClientError,
  log: Logger,
  /** Called when a route matches, before its checks (metrics: http/metrics.ts). */
  onRoute?: (route: PlainRoute, req: Request, res: Response) => void,
) {
  function sendError(res: Response, error: unknown, correlation: Correlation): void {
    const { error: e, unexpected } = toClientError(error);
    if (unexpected) {
      log.error(
        {
          err: error,
          correlation_id: correlation.id,
          trace_id: correlation.trace?.traceId,
          span_id: correlation.trace?.spanId,
        },
        "plain route failed",
      );
    }
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const retryAfter = e.metadata.get("retry-after");
    if (retryAfter) res.setHeader("retry-after", retryAfter);
    if (e.code === 16) res.setHeader("www-authenticate", 'Bearer realm="meshwork"');
    const reason = e.findDetails(ErrorInfoSchema)[0]?.reason;
    sendJson(res, httpStatusOfCode[e.code] ?? 500, {
      error: codeName(e.code),
      message: e.rawMessage,
      ...(reason && reason !== "INVALID_ARGUMENT" && { reason }),
    });
  }

  return (req: Request, res: Response, path: string, correlation: Correlation): boolean => {
    const method = req.method ?? "GET";
    let route: PlainRoute | undefined;
    let found: RegExpExecArray | null = null;
    for (const r of routes) {
      found = r.methods.includes(method) ? r.pattern.exec(path) : null;
      if (found) {
        route = r;
        break;
      }
    }
    if (!route || !found) return false;
    onRoute?.(route, req, res);
    (async () => {
      let principal = anonymousAdmin;
      if (route.roles !== "open") {
        principal = await guard.authenticate(header(req, "authorization"));
        guard.authorize(principal, route.roles, route.what);
        guard.rateLimit(principal);
        if (route.actsFor) await guard.actsFor(principal, route.actsFor(req));
      }
      await route.handle({ req, res, match: found, principal, correlation });
    })().catch((error: unknown) => {
      sendError(res, error, correlation);
      // Stop reading a refused upload.
      if (!req.readableEnded) req.resume();
    });
    return true;
  };
}
