import type * as http from "node:http";
import * as http2 from "node:http2";

type Request = http.IncomingMessage | http2.Http2ServerRequest;

/**
 * Refusals one connection may earn while its source is throttled, before
 * it is closed, if none of its requests has carried a valid token.
 */
const maxRefusals = 32;

/**
 * Closes connections that do nothing but fail to authenticate: once one
 * has had `maxRefusals` requests refused because its source is past its
 * budget of failed authentications (auth/failures.ts), and none of its
 * requests was accepted, an HTTP/2 connection gets GOAWAY (ENHANCE_YOUR_CALM) and is
 * closed, an HTTP/1.1 one is closed after its answer. A flood of streams
 * on one connection then costs at most that many requests before the
 * client has to connect again (and the per-source connection cap bounds
 * how often it can). A connection that has carried a valid token is never
 * closed for this: a client whose token was revoked just gets its 401s.
 */
export function createConnectionTrust() {
  const refused = new WeakMap<object, number>();
  const trusted = new WeakSet<object>();
  const condemned = new WeakSet<object>();
  const connectionOf = (req: Request): object =>
    "stream" in req ? (req.stream.session ?? req.stream) : req.socket;
  return {
    authenticated(req: Request): void {
      trusted.add(connectionOf(req));
    },
    refused(req: Request): void {
      const connection = connectionOf(req);
      if (trusted.has(connection)) return;
      const n = (refused.get(connection) ?? 0) + 1;
      refused.set(connection, n);
      if (n < maxRefusals) return;
      if ("stream" in req) {
        const session = req.stream.session;
        if (session && !session.destroyed) {
          session.goaway(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
          session.destroy();
        }
      } else {
        condemned.add(req.socket);
      }
    },
    /** Whether an HTTP/1.1 connection is to be closed once this response is sent. */
    condemned(socket: object | null): boolean {
      return socket !== null && condemned.has(socket);
    },
  };
}

export type ConnectionTrust = ReturnType<typeof createConnectionTrust>;
