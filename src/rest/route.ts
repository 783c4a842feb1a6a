import type { PlainRoute, Request, Response } from "../http/routes.js";
import type { CallerOf } from "./in-process.js";
import { rolesOf } from "./roles.js";

/** What a REST route's handler gets: the request, and the caller for its in-process RPCs. */
export interface RestCall {
  req: Request;
  res: Response;
  match: RegExpExecArray;
  body: AsyncIterable<Uint8Array>;
  /** Who calls, for which request; its signal aborts when the client goes away. */
  caller: CallerOf;
}

/**
 * A route of a REST contract: an adapter over the RPCs `rpcs` (as
 * auth/policy.ts names them, "LeaseService/RenewLease"). It admits the
 * roles those RPCs admit (roles.ts), so that a token the RPC would refuse
 * is refused before its body is read, and hands the handler the caller for
 * its in-process calls (in-process.ts), which check everything again.
 */
export function restRoute(
  methods: string[],
  pattern: RegExp,
  rpcs: string[],
  what: string,
  handle: (call: RestCall) => Promise<void>,
): PlainRoute {
  return {
    methods,
    pattern,
    roles: rolesOf(...rpcs),
    what,
    handle: ({ req, res, match, principal, correlation, body }) =>
      handle({
        req,
        res,
        match,
        body,
        caller: {
          principal,
          correlation,
          signal: signalOf(res),
          address: req.socket?.remoteAddress,
        },
      }),
  };
}

/** Aborted when the client goes away before its answer is sent. */
function signalOf(res: Response): AbortSignal {
  const controller = new AbortController();
  res.on("close", () => {
    if (!res.writableFinished) controller.abort();
  });
  return controller.signal;
}
