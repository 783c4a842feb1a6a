import type * as http from "node:http";
import * as http2 from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";

type Request = http.IncomingMessage | http2.Http2ServerRequest;
type Response = http.ServerResponse | http2.Http2ServerResponse;

/** The answer to a body that stopped: the handler's read fails with it. */
export class BodyStalled extends ConnectError {
  override name = "BodyStalled";
  constructor(seconds: number) {
    super(`the request body made no progress for ${seconds} s`, Code.DeadlineExceeded);
  }
}

/**
 * A request's body as the handler reads it, with a bound on a client that
 * stops sending: whenever the handler waits for the next bytes, they must
 * arrive within `idleMs`, or the request is ended — HTTP/1.1 with 408 and
 * the connection closed, HTTP/2 with RST_STREAM — and the read fails with
 * BodyStalled. The clock runs only while the handler waits for the client:
 * a handler that is slow itself (writing to a blob store) never trips it.
 *
 * With `betweenMessages` (a bidi stream: StreamLeases), the gaps between
 * whole envelopes (5-byte prefix and its message) are the client's to take
 * as long as it likes; only a message begun and not finished is timed.
 * Every other request's body is timed from its first byte to its end.
 */
export function guardedBody(
  req: Request,
  res: Response,
  options: { idleMs: number; betweenMessages?: boolean; connectError?: boolean },
): AsyncIterable<Uint8Array> {
  const { idleMs } = options;
  return {
    [Symbol.asyncIterator]() {
      const it = reader(req);
      // Bytes still owed to the envelope being read: its prefix (5) and then its message.
      let prefix = Buffer.alloc(0);
      let owed = 0;
      let midMessage = false;
      const track = (chunk: Uint8Array) => {
        let at = 0;
        while (at < chunk.byteLength) {
          if (owed > 0) {
            const take = Math.min(owed, chunk.byteLength - at);
            owed -= take;
            at += take;
            continue;
          }
          const need = 5 - prefix.byteLength;
          const part = chunk.subarray(at, at + need);
          prefix = Buffer.concat([prefix, part]);
          at += part.byteLength;
          if (prefix.byteLength === 5) {
            owed = prefix.readUInt32BE(1);
            prefix = Buffer.alloc(0);
          }
        }
        midMessage = owed > 0 || prefix.byteLength > 0;
      };
      return {
        async next(): Promise<IteratorResult<Uint8Array>> {
          const timed = !options.betweenMessages || midMessage;
          if (!timed) return step(await it.next());
          let timer: NodeJS.Timeout | undefined;
          const stalled = new Promise<never>((_, reject) => {
            timer = setTimeout(() => {
              endStalled(req, res, idleMs, options.connectError ?? false);
              reject(new BodyStalled(Math.round(idleMs / 1000)));
            }, idleMs);
          });
          try {
            return step(await Promise.race([it.next(), stalled]));
          } finally {
            clearTimeout(timer);
          }
        },
        async return(): Promise<IteratorResult<Uint8Array>> {
          it.detach();
          return { done: true, value: undefined };
        },
      };
      function step(r: IteratorResult<Uint8Array>): IteratorResult<Uint8Array> {
        if (!r.done && options.betweenMessages) track(r.value);
        return r;
      }
    },
  };
}

/**
 * Reads a request body chunk by chunk, the way `for await` would, but
 * without destroying the request when the reader gives up early: `detach`
 * only lets go of it, so that what is left can still be read and dropped
 * (closeUnread) and an HTTP/1.1 connection serve its next request. (A
 * stream's own async iterator destroys it on return, which left the
 * connection's socket paused half-way through the body.)
 */
function reader(stream: Request) {
  let ended = false;
  let failed: unknown;
  let waiting: (() => void) | undefined;
  const wake = () => {
    const w = waiting;
    waiting = undefined;
    w?.();
  };
  const onEnd = () => {
    ended = true;
    wake();
  };
  const onError = (error: unknown) => {
    failed ??= error;
    wake();
  };
  const onClose = () => {
    if (!ended) {
      failed ??= Object.assign(new Error("the request closed before its body ended"), {
        code: "ERR_STREAM_PREMATURE_CLOSE",
      });
    }
    wake();
  };
  stream.on("readable", wake);
  stream.on("end", onEnd);
  stream.on("error", onError);
  stream.on("close", onClose);
  const detach = () => {
    stream.off("readable", wake);
    stream.off("end", onEnd);
    stream.off("error", onError);
    stream.off("close", onClose);
  };
  return {
    async next(): Promise<IteratorResult<Uint8Array>> {
      for (;;) {
        if (failed !== undefined) {
          detach();
          throw failed;
        }
        const chunk = stream.read() as Uint8Array | null;
        if (chunk !== null) return { done: false, value: chunk };
        if (ended || stream.readableEnded) {
          detach();
          return { done: true, value: undefined };
        }
        await new Promise<void>((resolve) => {
          waiting = resolve;
        });
      }
    },
    detach,
  };
}

/**
 * Ends a request whose body stopped. HTTP/1.1: 408 (when nothing was
 * answered yet) with `connection: close`, then the socket; HTTP/2: the
 * stream is reset (CANCEL), the session goes on. The 408's body is a
 * Connect error for an RPC (`connectError`), the plain routes' error
 * otherwise.
 */
function endStalled(req: Request, res: Response, idleMs: number, connectError: boolean): void {
  if ("stream" in req) {
    req.stream.close(http2.constants.NGHTTP2_CANCEL);
    return;
  }
  const socket = req.socket;
  if (res.headersSent) {
    socket.destroy();
    return;
  }
  const message = `the request body made no progress for ${Math.round(idleMs / 1000)} s`;
  const body = JSON.stringify(
    connectError ? { code: "deadline_exceeded", message } : { error: "deadline_exceeded", message },
  );
  (res as http.ServerResponse).writeHead(408, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    connection: "close",
  });
  res.end(body, () => socket.destroy());
}

/** How long a body nobody will read may take to arrive once its response is sent (HTTP/1.1). */
const unreadGraceMs = 5000;

/**
 * After a response, drops what is left of a request body nobody read (a
 * request refused before its body, a body too large). HTTP/2 resets the
 * stream with NO_ERROR, as RFC 9113 §8.1 lets a server that has answered in
 * full. HTTP/1.1 reads the rest and throws it away, so that the connection
 * can serve the client's next request, but for five seconds at most: a
 * slow or endless body then has its connection closed, instead of holding
 * it until the request timeout. `socket` is the request's, taken when it
 * arrived: by the response's finish HTTP/1.1 has let go of it.
 */
export function closeUnread(req: Request, socket = req.socket): void {
  if ("stream" in req) {
    const stream = req.stream;
    if (stream.destroyed || stream.closed || stream.state.remoteClose) return;
    stream.close(http2.constants.NGHTTP2_NO_ERROR);
    return;
  }
  if (req.complete || !socket || socket.destroyed) return;
  // Destroyed half-way by someone else: the rest can no longer be read.
  if (req.destroyed) {
    socket.destroy();
    return;
  }
  // `complete` rather than only 'end': a body whose reading was given up
  // mid-way (its stream destroyed) ends without 'end', while the parser
  // still reads it to the end and the connection serves the next request.
  const timer = setTimeout(() => {
    if (!req.complete) socket.destroy();
  }, unreadGraceMs);
  timer.unref();
  const done = () => {
    clearTimeout(timer);
    req.off("end", done);
    socket.off("close", done);
  };
  req.once("end", done);
  socket.once("close", done);
  req.resume();
}
