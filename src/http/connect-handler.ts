import type * as http from "node:http";
import type * as http2 from "node:http2";
import { Code, ConnectError, type ContextValues, createConnectRouter } from "@connectrpc/connect";
import type { UniversalHandler } from "@connectrpc/connect/protocol";
import {
  type ConnectNodeAdapterOptions,
  compressionBrotli,
  compressionGzip,
  universalRequestFromNodeRequest,
  universalResponseToNodeResponse,
} from "@connectrpc/connect-node";
import type { Logger } from "../log.js";
import { guardedBody } from "./body-guard.js";
import { sendJson } from "./json.js";
import { createRefusalWriter } from "./rpc-refusal.js";
import type { Tarpit } from "./tarpit.js";

type Request = http.IncomingMessage | http2.Http2ServerRequest;
type Response = http.ServerResponse | http2.Http2ServerResponse;

export interface ConnectHandlerOptions
  extends Omit<ConnectNodeAdapterOptions, "contextValues" | "fallback"> {
  contextValues: (req: Request) => ContextValues;
  /**
   * A refusal the request's headers decide on their own (no token, a
   * malformed one, one already known to be invalid, a source past its
   * budget), answered at once in the request's protocol (rpc-refusal.ts)
   * with no handler started; undefined to go on.
   */
  refuseEarly?: (
    req: Request,
    service: string,
  ) => { error: ConnectError; throttled: string | undefined; mayBuffer: number } | undefined;
  /** Where the refusals of a throttled source wait before they are sent (tarpit.ts). */
  tarpit?: Tarpit;
  /** A request body that makes no progress for this long while read is ended (http/body-guard.ts). */
  bodyIdleMs: number;
  log: Pick<Logger, "debug">;
}

/**
 * Connect, gRPC and gRPC-Web for Node's HTTP/1.1 and HTTP/2 servers: what
 * connect-node's `connectNodeAdapter` does, with two differences.
 *
 * - The handler reads the body through guardedBody: a client that stops
 *   sending mid-body is ended after `bodyIdleMs` (408 / RST_STREAM) instead
 *   of holding the request until the whole-request timeout (HTTP/1.1 only)
 *   or for ever (HTTP/2). Only a bidi stream may rest between messages.
 * - A response that could not be written because the client went away is
 *   logged at debug, one line without a stack: a client that cancels is
 *   normal (connect-node writes each to the console with its stack).
 *
 * A request the headers alone refuse (refuseEarly) is answered before any
 * of this: no handler, no context, no body read. The request gate
 * (options.requestGate) runs before a body byte is read too: server.ts
 * authenticates there what needs a token lookup.
 */
export function createConnectHandler(options: ConnectHandlerOptions) {
  const router = createConnectRouter({
    ...options,
    acceptCompression: options.acceptCompression ?? [compressionGzip, compressionBrotli],
  });
  options.routes(router);
  const paths = new Map<string, UniversalHandler>();
  for (const h of router.handlers) paths.set(h.requestPath, h);
  const refusals = createRefusalWriter();

  function handle(req: Request, res: Response): void {
    const path = (req.url ?? "").split("?", 1)[0] ?? "";
    const handler = paths.get(path);
    if (!handler) {
      // Neither an RPC nor a plain route (those were matched before).
      sendJson(res, 404, {
        error: "not_found",
        message: `no route ${(req.method ?? "").slice(0, 16)} ${path.slice(0, 200)}`,
      });
      return;
    }
    // Only a request the refusal writer can answer is refused here (a Connect
    // GET is not): the others go to the gate, which counts their failure once.
    const early = refusals.speaks(req)
      ? options.refuseEarly?.(req, handler.service.typeName)
      : undefined;
    if (early) {
      const answer = () => refusals.refuse(req, res, early.error);
      if (!(early.throttled && options.tarpit?.hold(early.throttled, res, answer, early.mayBuffer)))
        answer();
      return;
    }
    const uReq = universalRequestFromNodeRequest(
      req as http.IncomingMessage,
      res as http.ServerResponse,
      undefined,
      options.contextValues(req),
    );
    uReq.body = guardedBody(req, res, {
      idleMs: options.bodyIdleMs,
      betweenMessages: handler.method.methodKind === "bidi_streaming",
      connectError: true,
    });
    handler(uReq)
      .then((uRes) => universalResponseToNodeResponse(uRes, res as http.ServerResponse))
      .catch((reason: unknown) => {
        // connect-node's own reading of a client that left (ECONNRESET, a
        // reset stream): `aborted`. Anything else here is a response write
        // that failed because the client went away too.
        const e = ConnectError.from(reason);
        if (e.code === Code.Aborted) return;
        options.log.debug(
          { rpc: `${handler.service.typeName}/${handler.method.name}`, reason: e.rawMessage },
          "response not completed: the client went away",
        );
      });
  }

  return Object.assign(handle, {
    /** The request paths of every RPC this handler serves (`/package.Service/Method`). */
    paths: new Set(paths.keys()) as ReadonlySet<string>,
  });
}
