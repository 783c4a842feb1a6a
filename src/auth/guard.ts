import { timingSafeEqual } from "node:crypto";
import { DomainError, permissionDenied, unauthenticated } from "../core/errors.js";
import { isUuid } from "../core/validate.js";
import type { TokenRoleName, TokenRow } from "../db/schema/index.js";
import { anonymousAdmin, type Principal } from "./principal.js";
import { createRateLimiter } from "./rate-limit.js";
import { digestOf, type TokenStore } from "./token-store.js";

export interface GuardOptions {
  /** `--auth on`: every request but the open ones needs a valid token. */
  enabled: boolean;
  tokens: Pick<TokenStore, "findByDigest" | "touch">;
  /** The token that registered a worker; undefined when there is no such worker. */
  ownerOf(workerId: string): Promise<string | null | undefined>;
  /** Requests per second per token (0: no limit), burst, and whether admin tokens count. */
  rateLimit: number;
  rateBurst: number;
  rateLimitAdmin: boolean;
  /** How long a token lookup is trusted: revocation takes effect within this. */
  cacheMs?: number;
  log?: { warn(obj: object, msg: string): void };
}

/** A request over the rate limit: `resource_exhausted`, with when to retry. */
function rateLimited(retryAfterMs: number): DomainError {
  return new DomainError(
    "resource_exhausted",
    "RATE_LIMITED",
    `too many requests for this token: retry in ${Math.ceil(retryAfterMs / 1000)} s`,
    { retryAfterMs },
  );
}

const bearer = /^Bearer[ ]+([A-Za-z0-9._~+/=-]{1,512})[ ]*$/i;

/**
 * The checks every request passes, RPC or plain HTTP: who is calling
 * (authenticate), whether the role may do this (authorize), whether a worker
 * token acts only for its own workers (actsFor), and the per-token rate
 * limit. The RPC interceptor and the plain-route dispatcher both use it.
 */
export function createGuard(options: GuardOptions) {
  const cacheMs = options.cacheMs ?? 500;
  const cache = new Map<string, { row: TokenRow | undefined; at: number }>();
  const limiter = createRateLimiter(options.rateLimit, options.rateBurst);

  async function lookUp(digest: string): Promise<TokenRow | undefined> {
    const hit = cache.get(digest);
    if (hit && performance.now() - hit.at < cacheMs) return hit.row;
    const row = await options.tokens.findByDigest(digest);
    if (cache.size > 10_000) cache.clear(); // random tokens must not grow it without bound
    cache.set(digest, { row, at: performance.now() });
    if (
      row &&
      !row.revokedAt &&
      (!row.lastUsedAt || Date.now() - row.lastUsedAt.getTime() > 60_000)
    ) {
      options.tokens.touch([row.id]).catch((error: unknown) => {
        options.log?.warn({ err: error }, "could not record a token's last use");
      });
    }
    return row;
  }

  return {
    enabled: options.enabled,

    /** The caller of a request with this Authorization header; `unauthenticated` without a valid token. */
    async authenticate(authorization: string | null | undefined): Promise<Principal> {
      if (!options.enabled) return anonymousAdmin;
      if (!authorization)
        throw unauthenticated("a bearer token is required (Authorization: Bearer <token>)");
      const m = bearer.exec(authorization);
      if (!m) throw unauthenticated("the Authorization header must be 'Bearer <token>'");
      const digest = digestOf(m[1] ?? "");
      const row = await lookUp(digest);
      // The lookup was by digest; compare again in constant time.
      const same =
        row !== undefined &&
        timingSafeEqual(Buffer.from(row.digest, "hex"), Buffer.from(digest, "hex"));
      if (!same || !row || row.revokedAt) throw unauthenticated("the bearer token is not valid");
      return { tokenId: row.id, name: row.name, role: row.role };
    },

    /** Admin may do everything; any other role must be among `roles`. */
    authorize(principal: Principal, roles: readonly TokenRoleName[], what: string): void {
      if (principal.role === "admin" || roles.includes(principal.role)) return;
      throw permissionDenied(`a ${principal.role} token may not ${what}`);
    },

    /**
     * A worker token acts only for workers registered with it. A worker
     * that does not exist is left to the handler (`not_found`), and so is an
     * id that is not a UUID (`invalid_argument`): no worker can have it, and
     * looking it up would fail the statement's uuid cast.
     */
    async actsFor(principal: Principal, workerIds: Iterable<string>): Promise<void> {
      if (principal.role !== "worker") return;
      for (const id of new Set(workerIds)) {
        if (!isUuid(id)) continue;
        const owner = await options.ownerOf(id.toLowerCase());
        if (owner !== undefined && owner !== principal.tokenId) {
          throw permissionDenied(
            `worker ${id} was registered with another token`,
            "FOREIGN_WORKER_TOKEN",
          );
        }
      }
    },

    /** Counts one request against the token's rate; `resource_exhausted` when over it. */
    rateLimit(principal: Principal): void {
      if (options.rateLimit === 0 || principal.tokenId === null) return;
      if (principal.role === "admin" && !options.rateLimitAdmin) return;
      const wait = limiter.take(principal.tokenId);
      if (wait > 0) throw rateLimited(wait);
    },
  };
}

export type Guard = ReturnType<typeof createGuard>;
