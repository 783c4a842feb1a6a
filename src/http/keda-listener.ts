import { readFileSync } from "node:fs";
import * as http2 from "node:http2";
import type { Socket } from "node:net";
import { splitHostPort } from "../config.js";
import { StartupError } from "../data-dir-lock.js";
import { listenOn } from "./listener.js";

/** The KEDA listener as it runs. */
export interface KedaListener {
  url: string;
  close(): Promise<void>;
}

/**
 * The KEDA external scaler's own listener (--keda-listen): HTTP/2 only,
 * which is what KEDA's gRPC client speaks; TLS with the coordinator's
 * certificate when one is configured, and with --keda-client-ca a client
 * certificate signed by that CA is required (KEDA's `tlsClientCert`):
 * KEDA sends no bearer token, so TLS is the only authentication there is.
 * Without it the listener must stay on a private network (it only tells
 * demand figures, and changes nothing).
 */
export async function listenKeda(
  handler: (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  options: { listen: string; tlsCert: string; tlsKey: string; clientCa: string },
): Promise<KedaListener> {
  let server: http2.Http2Server | http2.Http2SecureServer;
  if (options.tlsCert) {
    let tls: http2.SecureServerOptions;
    try {
      tls = {
        cert: readFileSync(options.tlsCert),
        key: readFileSync(options.tlsKey),
        ...(options.clientCa && {
          ca: readFileSync(options.clientCa),
          requestCert: true,
          rejectUnauthorized: true,
        }),
      };
    } catch (error) {
      throw new StartupError(
        `cannot read the KEDA listener's certificates: ${(error as Error).message.split("\n")[0]}`,
      );
    }
    server = http2.createSecureServer(tls, handler);
  } else {
    server = http2.createServer(handler);
  }
  // KEDA's gRPC calls are small and latency-bound (TCP_NODELAY, as on the main port).
  server.on("connection", (socket: Socket) => socket.setNoDelay(true));
  const listening = await listenOn(
    server,
    splitHostPort(options.listen),
    options.tlsCert ? "https" : "http",
  );
  return { url: listening.url, close: listening.closeNow };
}
