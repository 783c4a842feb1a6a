import type * as http from "node:http";
import type * as http2 from "node:http2";
import { Code } from "@connectrpc/connect";
import type { Guard } from "../auth/guard.js";
import { anonymousAdmin, type Principal } from "../auth/principal.js";
import type { Correlation } from "../core/context.js";
import { DomainError } from "../core/errors.js";
import type { TokenRoleName } from "../db/schema/index.js";
import type { Logger } from "../log.js";
import type { ToClientError } from "../rpc/errors.js";
import { guardedBody } from "./body-guard.js";
import type { ConnectionTrust } from "./connection-trust.js";
import { sendJson } from "./json.js";
import { refusalJson } from "./refusal-json.js";
import { askerOf } from "./source.js";
import type { Tarpit } from "./tarpit.js";

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
    /** The request body, to be read from here: a client that stops sending is ended (body-guard.ts). */
    body: AsyncIterable<Uint8Array>;
  }): Promise<void>;
}

/** A request header's first value, or "". */
export function header(req: Request, name: string): string {
  const v = req.headers[name];
  return (Array.isArray(v) ? v[0] : v) ?? "";
}

/**
 * Dispatches plain HTTP routes. Before a route runs, from the headers alone
 * and before any of the body is read: the bearer token, the role, the rate
 * limit and worker ownership (guard.ts), exactly as for RPCs.
 * Errors answer `{"error": "<code>", "message": "...", "reason": "..."}`
 * (reason when there is one, e.g. FOREIGN_WORKER) with the status of
 * the error table (docs/protocol.md#errors); nothing internal is shown.
 * A path a route takes, asked with a method it does not, is answered 405
 * with `Allow` and `{"error": "unimplemented", …}` (as grpc-gateway does).
 * Returns false when no route matches (the request goes on to Connect).
 */
export function createPlainRouter(
  routes: readonly PlainRoute[],
  guard: Guard,
  toClientError: ToClientError,
  log: Logger,
  options: {
    /** A body that makes no progress for this long while read is ended (body-guard.ts). */
    bodyIdleMs: number;
    /** The HTTP/2 stream window: what a request can buffer unread while its token is looked up. */
    h2Window: number;
    /** Called when a route matches, before its checks (metrics: http/metrics.ts). */
    onRoute?: (route: PlainRoute, req: Request, res: Response) => void;
    /** Where the refusals of a source past its budget of failed authentications wait (tarpit.ts). */
    tarpit?: Tarpit;
    /** Closes connections that only ever fail to authenticate (connection-trust.ts). */
    trust?: ConnectionTrust;
  },
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
    if (e.code === Code.Unauthenticated)
      res.setHeader("www-authenticate", 'Bearer realm="meshwork"');
    const answer = refusalJson(e);
    if (answer.reason === "STORAGE_FULL") {
      log.warn(
        { correlation_id: correlation.id, reason: answer.reason },
        "refused: the storage is full",
      );
    }
    sendJson(res, answer.status, answer.body);
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
    if (!route || !found) {
      // A known path asked with another method: 405 with the methods it takes.
      const allowed = [
        ...new Set(routes.filter((r) => r.pattern.test(path)).flatMap((r) => r.methods)),
      ];
      if (allowed.length === 0) return false;
      res.setHeader("allow", allowed.join(", "));
      sendJson(res, 405, {
        error: "unimplemented",
        message: `${method.slice(0, 16)} is not allowed here; use ${allowed.join(" or ")}`,
      });
      return true;
    }
    options.onRoute?.(route, req, res);
    const asker = askerOf(req, options.h2Window, options.trust);
    (async () => {
      let principal = anonymousAdmin;
      if (route.roles !== "open") {
        principal = await guard.authenticate(header(req, "authorization"), asker);
        guard.authorize(principal, route.roles, route.what);
        guard.rateLimit(principal);
        if (route.actsFor) await guard.actsFor(principal, route.actsFor(req));
      }
      const body = guardedBody(req, res, { idleMs: options.bodyIdleMs });
      await route.handle({ req, res, match: found, principal, correlation, body });
    })().catch((error: unknown) => {
      // What is left of a refused body is dropped once the answer is sent (closeUnread).
      const answer = () => sendError(res, error, correlation);
      const throttled = error instanceof DomainError && error.reason === "AUTH_THROTTLED";
      if (!(throttled && options.tarpit?.hold(asker.source, res, answer, asker.mayBuffer ?? 0)))
        answer();
    });
    return true;
  };
}
