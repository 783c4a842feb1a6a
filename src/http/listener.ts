import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import { sourceOf } from "./source.js";

type Handler = (
  req: http.IncomingMessage | http2.Http2ServerRequest,
  res: http.ServerResponse | http2.Http2ServerResponse,
) => void;

const preface = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");

/** What one client may hold of the server (README: Security). */
export interface ListenerLimits {
  /** HTTP/1.1 request headers, the TLS handshake and the cleartext sniffing stage. */
  headersTimeoutMs: number;
  /** HTTP/1.1: a whole request, body included. */
  requestTimeoutMs: number;
  /** HTTP/1.1 keep-alive connections and HTTP/2 sessions with no open stream. */
  idleTimeoutMs: number;
  maxConcurrentStreams: number;
  /** Request header block, HTTP/1.1 and HTTP/2. */
  maxHeaderBytes: number;
  /** Open connections one source address (an IPv6 /64) may hold; 0 = no limit. */
  maxConnectionsPerSource: number;
}

export interface ListenerOptions {
  /** PEM certificate and key: serve TLS, choosing HTTP/2 or HTTP/1.1 by ALPN. */
  tls?: { cert: Buffer; key: Buffer } | undefined;
  limits: ListenerLimits;
}

/**
 * The flow-control window of each HTTP/2 stream: what a client may send on
 * one stream before the server has read any of it. Sized for artifact
 * streams: with the 64 KiB default, a streamed upload stalls on
 * WINDOW_UPDATE round trips.
 */
export const h2StreamWindow = 4 * 1024 * 1024;

function h2Settings(limits: ListenerLimits): http2.Settings {
  return {
    initialWindowSize: h2StreamWindow,
    // Streams one connection may have open at once: each is a handler, a
    // body buffer and maybe a database call, so one client cannot start
    // unbounded work on one connection (a client that opens more than it was
    // told has its connection closed with GOAWAY).
    maxConcurrentStreams: limits.maxConcurrentStreams,
    // Decoded header block of a request, the HTTP/2 twin of HTTP/1.1's
    // maxHeaderSize: a bigger one has its stream reset before any handler runs.
    maxHeaderListSize: limits.maxHeaderBytes,
  };
}

/** Per-session set-up: the wide window, and closing the session once it is idle. */
function onSession(limits: ListenerLimits): (session: http2.ServerHttp2Session) => void {
  return (session) => {
    session.setLocalWindowSize(16 * 1024 * 1024);
    // An HTTP/2 connection costs a socket and nghttp2 state for as long as the
    // client keeps it: after idleTimeoutMs without a frame either way and with
    // no open stream, it is closed (GOAWAY). A session with an open stream is
    // left alone, as a quiet WatchTask or long poll is not idle; each call is
    // bounded by its own deadline (maxTimeoutMs). The timer re-arms on the next
    // frame, e.g. when that stream ends.
    let open = 0;
    session.on("stream", (stream: http2.ServerHttp2Stream) => {
      open++;
      stream.once("close", () => open--);
    });
    // (Not setTimeout's callback: that one is called only once.)
    session.setTimeout(limits.idleTimeoutMs);
    session.on("timeout", () => {
      if (open === 0) session.close();
    });
  };
}

/**
 * maxHeaderListSize binds only once the client has acknowledged our SETTINGS;
 * a request sent before that (or by a client that never acknowledges) gets
 * nghttp2's own ceiling of about 64 KiB per field. The same limit is applied
 * here to every HTTP/2 request, counted as HTTP/2 counts it (name + value +
 * 32 per field), with the reset nghttp2 itself sends: ENHANCE_YOUR_CALM,
 * which clients report as resource_exhausted.
 */
function refuseLargeHeaders(handler: Handler, maxHeaderBytes: number): Handler {
  return (req, res) => {
    if ("stream" in req) {
      const raw = req.rawHeaders;
      let size = 0;
      for (let i = 0; i < raw.length; i += 2) {
        size += (raw[i] ?? "").length + (raw[i + 1] ?? "").length + 32;
      }
      if (size > maxHeaderBytes) {
        req.stream.close(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
        return;
      }
    }
    handler(req, res);
  };
}

/**
 * HTTP/1.1 limits, for http.Server and for the HTTP/1.1 side of the TLS
 * server (which reads the same properties).
 */
function http1Limits(limits: ListenerLimits) {
  // Node rejects a headers timeout longer than the request timeout.
  const headersTimeout = Math.min(limits.headersTimeoutMs, limits.requestTimeoutMs);
  return {
    // Slow-loris: a client that dribbles its headers holds a socket and a
    // parser; it gets 408 and is closed after headersTimeout.
    headersTimeout,
    // A whole request, body included (artifact uploads too: the default is long).
    requestTimeout: limits.requestTimeoutMs,
    // Node checks both timeouts only every connectionsCheckingInterval
    // (default 30 s, which would triple a 10 s headers timeout).
    connectionsCheckingInterval: Math.max(100, Math.min(1000, headersTimeout / 2)),
    // Idle keep-alive connections are closed after this.
    keepAliveTimeout: limits.idleTimeoutMs,
    // Larger request headers are answered 431 and the connection closed.
    maxHeaderSize: limits.maxHeaderBytes,
  } satisfies http.ServerOptions;
}

/**
 * One port for HTTP/1.1 and HTTP/2. In cleartext, the first bytes of each
 * connection are sniffed: the HTTP/2 preface goes to an h2c server, anything
 * else to the HTTP/1.1 server. The socket is handed over as the native TCP
 * socket with the sniffed bytes put back (Node's HTTP/2 session replays
 * buffered data), so HTTP/2 keeps the fast native stream path; wrapping it in
 * a JS stream, as general-purpose sniffers do, cost most of the server's CPU
 * in per-frame writes here. TCP_NODELAY is set on every connection: without
 * it Nagle and delayed ACKs add ~40 ms to each gRPC call. With TLS, ALPN
 * chooses (node:http2 with allowHTTP1).
 *
 * The limits are set here (README: Security); message sizes, compression and
 * deadlines are the Connect adapter's (server.ts).
 */
/**
 * Counts each source's open connections and closes at once, before a byte
 * is read, a connection beyond `max` (0 = no limit): one client cannot hold
 * every socket, however many streams or bodies it leaves hanging.
 */
function connectionsPerSource(max: number): (socket: net.Socket) => boolean {
  const open = new Map<string, number>();
  return (socket) => {
    if (max === 0) return true;
    const source = sourceOf(socket.remoteAddress);
    const n = open.get(source) ?? 0;
    if (n >= max) {
      socket.destroy();
      return false;
    }
    open.set(source, n + 1);
    socket.once("close", () => {
      const left = (open.get(source) ?? 1) - 1;
      if (left === 0) open.delete(source);
      else open.set(source, left);
    });
    return true;
  };
}

export function createListener(serve: Handler, options: ListenerOptions): net.Server {
  const { limits } = options;
  const handler = refuseLargeHeaders(serve, limits.maxHeaderBytes);
  const admit = connectionsPerSource(limits.maxConnectionsPerSource);
  if (options.tls) {
    const server = http2.createSecureServer(
      {
        ...options.tls,
        allowHTTP1: true,
        ALPNProtocols: ["h2", "http/1.1"],
        settings: h2Settings(limits),
        // A client that opens a connection and never finishes the handshake.
        handshakeTimeout: limits.headersTimeoutMs,
      },
      handler,
    );
    // The HTTP/1.1 side of this server reads the same properties as
    // http.Server; they are set before listen() starts the checking interval.
    Object.assign(server, http1Limits(limits));
    server.on("session", onSession(limits));
    // Before the handshake: a refused connection costs no TLS work.
    server.prependListener("connection", (socket: net.Socket) => {
      admit(socket);
    });
    server.on("secureConnection", (socket: net.Socket) => socket.setNoDelay(true));
    return server;
  }
  const h1 = http.createServer(http1Limits(limits), handler);
  // headersTimeout and requestTimeout are enforced by a checker that Node
  // starts on 'listening'; h1 never listens (it is handed sockets), so start
  // it here, before the first connection: without it, neither timeout
  // applies at all.
  h1.emit("listening");
  const h2 = http2.createServer({ settings: h2Settings(limits) }, handler);
  h2.on("session", onSession(limits));
  const server = net.createServer({ noDelay: true }, (socket) => {
    if (!admit(socket)) return;
    socket.setNoDelay(true);
    socket.on("error", () => socket.destroy());
    // A connection that sends nothing, or less than the HTTP/2 preface, would
    // otherwise sit here forever, out of reach of both servers' timeouts.
    const sniffing = setTimeout(() => socket.destroy(), limits.headersTimeoutMs);
    socket.once("close", () => clearTimeout(sniffing));
    sniff(socket, Buffer.alloc(0), () => clearTimeout(sniffing));
  });
  function sniff(socket: net.Socket, seen: Buffer, handedOver: () => void): void {
    const chunk = socket.read() as Buffer | null;
    const data = chunk ? Buffer.concat([seen, chunk]) : seen;
    const maybeH2 = data
      .subarray(0, preface.length)
      .equals(preface.subarray(0, Math.min(data.length, preface.length)));
    if (data.length > 0 && (!maybeH2 || data.length >= preface.length)) {
      handedOver();
      socket.removeAllListeners("error");
      socket.unshift(data);
      (maybeH2 ? h2 : h1).emit("connection", socket);
      return;
    }
    socket.once("readable", () => sniff(socket, data, handedOver));
  }
  server.on("close", () => {
    h1.close();
    h2.close();
  });
  return server;
}

/** A server listening on its address, with the sockets it holds. */
export interface Listening {
  /** e.g. http://127.0.0.1:43127 (an IPv6 host in brackets). */
  url: string;
  port: number;
  /** Stops accepting and ends every open connection at once. */
  closeNow(): Promise<void>;
  /** The open connections, for a close that waits for some first. */
  sockets: Set<net.Socket>;
}

/**
 * Listens on `host:port` (port 0: a free one), keeping the open sockets so
 * that a close can end them (server.close() alone waits for idle
 * keep-alive connections and streams). Rejects with the listen error
 * (EADDRINUSE, EACCES).
 */
export async function listenOn(
  server: net.Server,
  address: { host: string; port: number },
  scheme: "http" | "https",
): Promise<Listening> {
  const sockets = new Set<net.Socket>();
  server.on("connection", (socket: net.Socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(address.port, address.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as net.AddressInfo).port;
  const urlHost = address.host.includes(":") ? `[${address.host}]` : address.host;
  return {
    url: `${scheme}://${urlHost}:${port}`,
    port,
    sockets,
    async closeNow() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await closed;
    },
  };
}
