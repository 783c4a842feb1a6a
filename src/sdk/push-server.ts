import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import {
  checkDispatchSignature,
  type DispatchBody,
  parseDispatchBody,
  signatureHeader,
} from "./dispatch.js";

// The HTTP side of a push worker: one route, `POST {dispatch_path}`, whose
// requests are checked (size, signature, body) before the worker decides.

/** What the worker answers a checked dispatch: 202, 409, 410, 429 or 503, a code and a message. */
export interface Verdict {
  status: number;
  /** `accepted`, `already_accepted`, `at_capacity`, `stopping`, `not_registered`. */
  code: string;
  message: string;
}

export interface PushServerOptions {
  /** `HOST:PORT`, `:PORT` or `PORT` (then on every interface); `[::1]:PORT` for IPv6. */
  listen: string;
  path: string;
  secret: string;
  maxBodyBytes: number;
  /** Decides on a dispatch whose signature held; called at once, never awaited long. */
  accept(body: DispatchBody): Verdict;
  log(message: string): void;
}

export interface PushServer {
  /** `http://HOST:PORT` as bound (the port chosen when 0 was asked). */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  close(): Promise<void>;
}

/** HOST and PORT of a listen address; a TypeError names a bad one. */
export function listenAddress(listen: string): { host: string; port: number } {
  const m = /^(?:(\[[^\]]+\]|[^:[\]]*):)?(\d{1,5})$/.exec(listen.trim());
  const port = Number(m?.[2]);
  if (!m || port > 65535) {
    throw new TypeError(
      `listen must be HOST:PORT, :PORT or PORT, not ${JSON.stringify(listen.slice(0, 200))}`,
    );
  }
  const host = (m[1] ?? "").replace(/^\[|\]$/g, "");
  return { host: host || "0.0.0.0", port };
}

/** A JSON answer: `{"status", "message"}` for a 2xx, `{"error", "message"}` otherwise. */
function send(res: ServerResponse, { status, code, message }: Verdict): void {
  if (res.headersSent) return;
  const text = JSON.stringify(status < 300 ? { status: code, message } : { error: code, message });
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
  });
  res.end(text);
}

/**
 * The body, or "too large" past `max` bytes: what follows is read and
 * dropped, so that the client gets to read the 413, up to `4 × max` (then
 * the connection is cut).
 */
function readBody(req: IncomingMessage, max: number): Promise<Buffer | "too large"> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size <= max) chunks.push(chunk);
      else if (size > 4 * max) {
        req.destroy();
        resolve("too large");
      }
    });
    req.on("end", () => resolve(size > max ? "too large" : Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

/**
 * Starts the receiver. A request is refused in this order, before any work:
 * another path 404, another method 405, a body over `maxBodyBytes` 413
 * (by its Content-Length, or once that many bytes arrived), a missing,
 * stale (±5 min) or wrong signature 401, a body that is not a dispatch 400;
 * then `accept` answers. Refusals close the connection.
 */
export async function startPushServer(options: PushServerOptions): Promise<PushServer> {
  const { path, secret, maxBodyBytes, accept, log } = options;
  const { host, port } = listenAddress(options.listen);

  const refuse = (res: ServerResponse, status: number, code: string, message: string) => {
    res.setHeader("connection", "close");
    send(res, { status, code, message });
  };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const pathname = (req.url ?? "/").split("?")[0];
    if (pathname !== path) {
      refuse(res, 404, "not_found", `no route ${req.method} ${pathname}`);
      return;
    }
    if (req.method !== "POST") {
      res.setHeader("allow", "POST");
      refuse(res, 405, "method_not_allowed", `${path} takes POST`);
      return;
    }
    const declared = Number(req.headers["content-length"] ?? 0);
    const body = declared > 4 * maxBodyBytes ? "too large" : await readBody(req, maxBodyBytes);
    if (body === "too large") {
      refuse(res, 413, "too_large", `the body is over ${maxBodyBytes} bytes`);
      return;
    }
    const header = req.headers[signatureHeader];
    const why = checkDispatchSignature(Array.isArray(header) ? header[0] : header, body, secret);
    if (why) {
      log(`refused a dispatch from ${req.socket.remoteAddress}: ${why}`);
      refuse(res, 401, "unauthenticated", why);
      return;
    }
    const dispatch = parseDispatchBody(body.toString("utf8"));
    if (typeof dispatch === "string") {
      refuse(res, 400, "invalid_argument", dispatch);
      return;
    }
    const verdict = accept(dispatch);
    if (verdict.status >= 400) res.setHeader("connection", "close");
    send(res, verdict);
  };

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      log(`a dispatch failed: ${(error as Error).message}`);
      refuse(res, 500, "internal", "the receiver failed");
    });
  });
  // Bounds on a slow or silent client: a dispatch is small.
  server.headersTimeout = 10_000;
  server.requestTimeout = 30_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  const shown = address.address.includes(":") ? `[${address.address}]` : address.address;
  return {
    url: `http://${shown}:${address.port}`,
    host: address.address,
    port: address.port,
    close() {
      return new Promise((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
    },
  };
}
