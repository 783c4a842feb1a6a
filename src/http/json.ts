import type * as http from "node:http";
import type * as http2 from "node:http2";

/** Sends a JSON body with its status and length (HTTP/1.1 or HTTP/2 compat response). */
export function sendJson(
  res: http.ServerResponse | http2.Http2ServerResponse,
  status: number,
  body: unknown,
): void {
  const text = JSON.stringify(body);
  (res as http.ServerResponse).writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
  });
  res.end(text);
}
