import { type ContextValues, createContextKey } from "@connectrpc/connect";
import type { TokenRoleName } from "../db/schema/index.js";

/** Who is calling: the token presented, or everyone when auth is off. */
export interface Principal {
  /** The token's id; null when auth is off. */
  tokenId: string | null;
  name: string;
  role: TokenRoleName;
}

/** Who is asking, as the network tells it: a source address key (http/source.ts). */
export interface Asker {
  source?: string | undefined;
  /** The peer's own address (the socket's), which a worker registration records (registered_from). */
  address?: string | undefined;
  /** The most request-body bytes that can pile up while a lookup runs (0 when none can). */
  mayBuffer?: number | undefined;
  /**
   * Told when the request's token is found valid, or when it is refused
   * (throttled: its source is past its budget of failures), for
   * http/connection-trust.ts.
   */
  onAuthenticated?: (() => void) | undefined;
  onRefused?: ((throttled: boolean) => void) | undefined;
}

/** With `--auth off` (loopback only) every caller acts as admin. */
export const anonymousAdmin: Principal = { tokenId: null, name: "anonymous", role: "admin" };

/**
 * A caller already authenticated, and counted against its rate limit: by
 * the plain HTTP route that makes this RPC in process (rest/in-process.ts),
 * or by the request gate before the body was read (server.ts). Only the
 * server sets it: context values never come from the wire.
 */
export const kPreauthenticated = createContextKey<Principal | undefined>(undefined, {
  description: "caller authenticated by a plain route",
});

/**
 * The caller of an RPC: set by the auth interceptor before any handler
 * runs. No default: a handler read through callerOf fails closed when the
 * interceptor did not run, instead of acting as an anonymous admin.
 */
export const kPrincipal = createContextKey<Principal | undefined>(undefined, {
  description: "caller",
});

/**
 * The caller of an RPC (kPrincipal). Absent only when a handler runs
 * without the auth interceptor, which is a wiring bug: the call is refused
 * (`internal`, logged), never served as anyone. Every path that serves RPCs
 * (server.ts, the in-process REST calls, the tests' transports) runs it.
 */
export function callerOf(values: ContextValues): Principal {
  const principal = values.get(kPrincipal);
  if (!principal) throw new Error("no caller in the context: the auth interceptor did not run");
  return principal;
}

/**
 * Where a network call comes from (its source address, the body bytes it
 * may buffer unread), set by server.ts from the request, for the request
 * gate's authentication (guard.authenticate). Absent in process.
 */
export const kAsker = createContextKey<Asker | undefined>(undefined, {
  description: "the network side of a caller",
});
