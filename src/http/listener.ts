import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";

type Handler = (
  req: http.IncomingMessage | http2.Http2ServerRequest,
  res: http.ServerResponse | http2.Http2ServerResponse,
) => void;

const preface = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");

/**
 * HTTP/2 flow-control windows sized for artifact streams: with the 64 KiB
 * defaults, a streamed upload stalls on WINDOW_UPDATE round trips.
 */
const h2Settings: http2.Settings = { initialWindowSize: 4 * 1024 * 1024 };

function widenWindow(session: http2.Http2Session): void {
  session.setLocalWindowSize(16 * 1024 * 1024);
}

export interface ListenerOptions {
  /** PEM certificate and key: serve TLS, choosing HTTP/2 or HTTP/1.1 by ALPN. */
  tls?: { cert: Buffer; key: Buffer } | undefined;
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
 */
export function createListener(handler: Handler, options: ListenerOptions = {}): net.Server {
  if (options.tls) {
    const server = http2.createSecureServer(
      { ...options.tls, allowHTTP1: true, ALPNProtocols: ["h2", "http/1.1"], settings: h2Settings },
      handler,
    );
    server.on("session", widenWindow);
    server.on("secureConnection", (socket: net.Socket) => socket.setNoDelay(true));
    return server;
  }
  const h1 = http.createServer(handler);
  const h2 = http2.createServer({ settings: h2Settings }, handler);
  h2.on("session", widenWindow);
  const server = net.createServer({ noDelay: true }, (socket) => {
    socket.setNoDelay(true);
    socket.on("error", () => socket.destroy());
    sniff(socket, Buffer.alloc(0));
  });
  function sniff(socket: net.Socket, seen: Buffer): void {
    const chunk = socket.read() as Buffer | null;
    const data = chunk ? Buffer.concat([seen, chunk]) : seen;
    const maybeH2 = data
      .subarray(0, preface.length)
      .equals(preface.subarray(0, Math.min(data.length, preface.length)));
    if (data.length > 0 && (!maybeH2 || data.length >= preface.length)) {
      socket.removeAllListeners("error");
      socket.unshift(data);
      (maybeH2 ? h2 : h1).emit("connection", socket);
      return;
    }
    socket.once("readable", () => sniff(socket, data));
  }
  server.on("close", () => {
    h1.close();
    h2.close();
  });
  return server;
}
