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

/** The caller of an RPC: set by the auth interceptor before any handler runs. */
export const kPrincipal = createContextKey<Principal>(anonymousAdmin, { description: "caller" });
