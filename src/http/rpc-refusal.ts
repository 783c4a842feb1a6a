import type * as http from "node:http";
import type * as http2 from "node:http2";
import type { ConnectError } from "@connectrpc/connect";
import {
  codeToHttpStatus,
  contentTypeStreamRegExp,
  contentTypeUnaryRegExp,
  endStreamFlag,
  endStreamToJson,
  errorToJsonBytes,
} from "@connectrpc/connect/protocol-connect";
import {
  contentTypeRegExp as grpcContentType,
  setTrailerStatus,
} from "@connectrpc/connect/protocol-grpc";
import {
  contentTypeRegExp as grpcWebContentType,
  trailerFlag,
  trailerSerialize,
} from "@connectrpc/connect/protocol-grpc-web";

type Request = http.IncomingMessage | http2.Http2ServerRequest;
type Response = http.ServerResponse | http2.Http2ServerResponse;

/** A refusal as it goes on the wire in one protocol: status, headers, body, trailers. */
interface Wire {
  status: number;
  headers: Record<string, string>;
  body: Uint8Array;
  trailers?: Record<string, string>;
}

type Protocol = "connect" | "connect-stream" | "grpc" | "grpc-web";

/** The protocol of a request, by method and content type, as connect-es tells them apart. */
function protocolOf(req: Request): Protocol | undefined {
  if (req.method !== "POST") return undefined;
  const type = req.headers["content-type"] ?? "";
  if (grpcWebContentType.test(type)) return "grpc-web";
  if (grpcContentType.test(type)) return "grpc";
  if (contentTypeStreamRegExp.test(type)) return "connect-stream";
  if (contentTypeUnaryRegExp.test(type)) return "connect";
  return undefined;
}

function envelope(flags: number, data: Uint8Array): Uint8Array {
  const out = new Uint8Array(5 + data.byteLength);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, data.byteLength);
  out.set(data, 5);
  return out;
}

function headersOf(h: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  h.forEach((value, key) => {
    out[key] = value;
  });
  return out;
}

/** An error in each protocol's own form, as connect-es writes it for an error raised before any message. */
function wireOf(error: ConnectError, protocol: Protocol, contentType: string): Wire {
  switch (protocol) {
    case "connect": {
      const headers = headersOf(error.metadata);
      headers["content-type"] = "application/json";
      return { status: codeToHttpStatus(error.code), headers, body: errorToJsonBytes(error, {}) };
    }
    case "connect-stream": {
      const json = JSON.stringify(endStreamToJson(error.metadata, error, {}));
      return {
        status: 200,
        headers: { "content-type": contentType },
        body: envelope(endStreamFlag, new TextEncoder().encode(json)),
      };
    }
    case "grpc":
      return {
        status: 200,
        headers: { "content-type": contentType },
        body: new Uint8Array(0),
        trailers: headersOf(setTrailerStatus(new Headers(), error)),
      };
    case "grpc-web":
      return {
        status: 200,
        headers: { "content-type": contentType },
        body: envelope(trailerFlag, trailerSerialize(setTrailerStatus(new Headers(), error))),
      };
  }
}

/**
 * Answers an RPC request with `error` at once, in the request's own
 * protocol (Connect unary: the HTTP status of the code and a JSON error;
 * Connect streaming: an end-stream message; gRPC: the status in trailers;
 * gRPC-Web: a trailer frame), without reading its body or starting a
 * handler: the answer to a request without a valid token
 * (http/connect-handler.ts). Each error's bytes are made once per protocol
 * and content type, so a flood of the same refusal costs a write each.
 * `speaks` tells whether a request is one it can answer: one whose protocol
 * it can tell (Connect's own handling answers the others: 415, 405).
 */
export function createRefusalWriter() {
  const made = new WeakMap<ConnectError, Map<string, Wire>>();
  return {
    speaks: (req: Request): boolean => protocolOf(req) !== undefined,
    refuse,
  };
  function refuse(req: Request, res: Response, error: ConnectError): void {
    const protocol = protocolOf(req);
    if (!protocol) throw new Error("refuse: not an RPC request (check speaks first)");
    const contentType = req.headers["content-type"] ?? "";
    let forError = made.get(error);
    if (!forError) {
      forError = new Map();
      made.set(error, forError);
    }
    const key = `${protocol} ${contentType}`;
    let wire = forError.get(key);
    if (!wire) {
      wire = wireOf(error, protocol, contentType);
      if (forError.size < 16) forError.set(key, wire);
    }
    const r = res as http.ServerResponse;
    if (wire.trailers) {
      r.writeHead(wire.status, wire.headers);
      r.addTrailers(wire.trailers);
    } else {
      r.writeHead(wire.status, { ...wire.headers, "content-length": String(wire.body.byteLength) });
    }
    r.end(wire.body);
  }
}
