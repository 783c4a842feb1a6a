import type { DescService } from "@bufbuild/protobuf";
import {
  type Client,
  type ConnectRouter,
  createClient,
  createConnectRouter,
  type Interceptor,
} from "@connectrpc/connect";
import { createAsyncIterable, type UniversalHandler } from "@connectrpc/connect/protocol";
import { createTransport } from "@connectrpc/connect/protocol-connect";
import { kAsker, kPreauthenticated, type Principal } from "../auth/principal.js";
import { type Correlation, correlationValues } from "../core/context.js";

/** Who makes an in-process call, and for which request. */
export interface CallerOf {
  /** The caller, authenticated and counted against its rate limit by the plain route. */
  principal: Principal;
  correlation: Correlation;
  /** Aborted when the HTTP request goes away. */
  signal: AbortSignal;
  /** The HTTP request's peer address (kAsker), which a worker registration records. */
  address?: string | undefined;
}

/**
 * RPC clients that call Meshwork's own services in process, through the
 * same interceptors as a call from the network (logging, error mapping, the
 * method's auth rule and worker ownership, the NUL check). The REST routes
 * are adapters over these clients: no rule of the services can be missed by
 * an adapter, because an adapter can only call the RPCs.
 *
 * The caller comes in the call's context values (kPreauthenticated), which
 * no request from the network can set: the plain route has checked the
 * bearer token and counted the request against the token's rate limit once.
 */
export function createInProcessCaller(
  routes: (router: ConnectRouter) => void,
  interceptors: Interceptor[],
) {
  const router = createConnectRouter({ interceptors, grpc: false, grpcWeb: false });
  routes(router);
  const handlers = new Map<string, UniversalHandler>(
    router.handlers.map((h) => [h.requestPath, h]),
  );

  return function clientFor<S extends DescService>(service: S, caller: CallerOf): Client<S> {
    const contextValues = correlationValues(caller.correlation)
      .set(kPreauthenticated, caller.principal)
      .set(kAsker, { address: caller.address });
    const transport = createTransport({
      baseUrl: "http://in-process",
      useBinaryFormat: true,
      interceptors: [],
      acceptCompression: [],
      sendCompression: null,
      compressMinBytes: Number.MAX_SAFE_INTEGER,
      readMaxBytes: Number.MAX_SAFE_INTEGER,
      writeMaxBytes: Number.MAX_SAFE_INTEGER,
      httpClient: async (req) => {
        const handler = handlers.get(new URL(req.url).pathname);
        if (!handler) throw new Error(`no in-process handler for ${req.url}`);
        const res = await handler({
          httpVersion: "2.0",
          method: req.method,
          url: req.url,
          header: req.header,
          body: req.body ?? createAsyncIterable([]),
          signal: req.signal ? AbortSignal.any([req.signal, caller.signal]) : caller.signal,
          contextValues,
        });
        return {
          status: res.status,
          header: new Headers(res.header),
          trailer: new Headers(res.trailer),
          body: res.body ?? createAsyncIterable([]),
        };
      },
    });
    return createClient(service, transport);
  };
}

export type InProcessCaller = ReturnType<typeof createInProcessCaller>;
