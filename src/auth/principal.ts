import { createContextKey } from "@connectrpc/connect";
import type { TokenRoleName } from "../db/schema/index.js";

/** Who is calling: the token presented, or everyone when auth is off. */
export interface Principal {
  /** The token's id; null when auth is off. */
  tokenId: string | null;
  name: string;
  role: TokenRoleName;
}

/** With `--auth off` (loopback only) every caller acts as admin. */
export const anonymousAdmin: Principal = { tokenId: null, name: "anonymous", role: "admin" };

/**
 * A caller already authenticated, and counted against its rate limit, by
 * the plain HTTP route that makes this RPC in process (rest/in-process.ts).
 * Only in-process calls can set it: context values never come from the wire.
 */
export const kPreauthenticated = createContextKey<Principal | undefined>(undefined, {
  description: "caller authenticated by a plain route",
});

/** The caller of an RPC: set by the auth interceptor before any handler runs. */
export const kPrincipal = createContextKey<Principal>(anonymousAdmin, { description: "caller" });
