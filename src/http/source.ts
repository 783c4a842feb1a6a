import type * as http from "node:http";
import type * as http2 from "node:http2";
import { isIPv6 } from "node:net";
import type { Asker } from "../auth/principal.js";
import type { ConnectionTrust } from "./connection-trust.js";

export type Request = http.IncomingMessage | http2.Http2ServerRequest;

/**
 * The source a connection is counted under, for the per-source limits
 * (connections, failed authentications): an IPv4 address as it is (an
 * IPv4-mapped IPv6 address as its IPv4), an IPv6 address by its /64, the
 * block one host or one customer usually gets.
 */
export function sourceOf(address: string | undefined): string {
  if (!address) return "unknown";
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped?.[1]) return mapped[1];
  // An IPv4 address has no colon: the IPv6 parse is skipped on every request from one.
  if (!address.includes(":") || !isIPv6(address)) return address;
  const [head = "", tail = ""] = address.toLowerCase().split("::", 2);
  const left = head === "" ? [] : head.split(":");
  const right = tail === "" ? [] : tail.split(":");
  const groups = address.includes("::")
    ? [...left, ...Array(8 - left.length - right.length).fill("0"), ...right]
    : left;
  return `${groups
    .slice(0, 4)
    .map((g) => g.replace(/^0+(?=.)/, ""))
    .join(":")}::/64`;
}

/**
 * HTTP/1.1 body bytes that can pile up, unread, before a request is
 * authenticated: the parser's buffer and the socket's, after which TCP
 * pushes back.
 */
const http1Unread = 64 * 1024;

/**
 * Who a request comes from, for the guard: its source, and the most body
 * bytes that can pile up unread while its token is looked up — its declared
 * length when smaller, else what the protocol lets a client send unread
 * (HTTP/2: the stream's flow-control window, `h2Window`).
 */
export function askerOf(req: Request, h2Window: number, trust?: ConnectionTrust): Asker {
  const declared = Number(req.headers["content-length"] ?? Number.NaN);
  const most = "stream" in req ? h2Window : http1Unread;
  const ended =
    "stream" in req
      ? req.stream.endAfterHeaders
      : declared === 0 || (!Number.isFinite(declared) && !req.headers["transfer-encoding"]);
  return {
    source: sourceOf(req.socket?.remoteAddress),
    address: req.socket?.remoteAddress,
    mayBuffer: ended ? 0 : Number.isFinite(declared) ? Math.min(declared, most) : most,
    ...(trust && {
      onAuthenticated: () => trust.authenticated(req),
      onRefused: (throttled: boolean) => {
        if (throttled) trust.refused(req);
      },
    }),
  };
}
