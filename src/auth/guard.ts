import { timingSafeEqual } from "node:crypto";
import { DomainError, permissionDenied, unauthenticated } from "../core/errors.js";
import { isUuid } from "../core/validate.js";
import type { TokenRoleName, TokenRow } from "../db/schema/index.js";
import { createAuthFailures } from "./failures.js";
import { type Asker, anonymousAdmin, type Principal } from "./principal.js";
import { createRateLimiter } from "./rate-limit.js";
import { createStreamRevocation } from "./revocation.js";
import { digestOf, isTokenShaped, type TokenStore } from "./token-store.js";

export interface GuardOptions {
  /** `--auth on`: every request but the open ones needs a valid token. */
  enabled: boolean;
  tokens: Pick<TokenStore, "findByDigest" | "touch">;
  /**
   * Where a token already known to be valid is read again once its cache
   * entry is older than cacheMs: the database pool's urgent lane, so that a
   * burst of claims cannot hold up a worker's renewals and completions at
   * their authentication (default: `tokens`). Unknown tokens never use it.
   */
  knownTokens?: Pick<TokenStore, "findByDigest">;
  /**
   * Which of these token ids are revoked now: read every half second for the
   * tokens that hold open streams (revocation.ts), on a connection outside
   * the request pool.
   */
  revokedAmong?: (tokenIds: string[]) => Promise<string[]>;
  /** The token that registered a worker; undefined when there is no such worker. */
  ownerOf(workerId: string): Promise<string | null | undefined>;
  /** Requests per second per token (0: no limit), burst, and whether admin tokens count. */
  rateLimit: number;
  rateBurst: number;
  rateLimitAdmin: boolean;
  /**
   * Failed authentications a second per source address (0: no limit), and
   * the burst: past it, a source gets 429 without a lookup for any token not
   * known to be valid (failures.ts).
   */
  authFailureRate?: number;
  authFailureBurst?: number;
  /**
   * Bytes that requests waiting for a token lookup may have buffered
   * between them (each counts the most its body can hold by then); past it,
   * `unavailable` at once, without a lookup (0: no cap).
   */
  maxPendingAuthBytes?: number;
  /** How long a token lookup is trusted: revocation takes effect within this. */
  cacheMs?: number;
  log?: { info(obj: object, msg: string): void; warn(obj: object, msg: string): void };
  /** Told of every failed authentication (metrics), by why: missing, malformed, invalid, throttled. */
  onFailure?: (why: AuthFailure) => void;
}

/** Why an authentication failed, as counted and logged. */
export type AuthFailure = "missing" | "malformed" | "invalid" | "throttled" | "busy";

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

/** Most negative (unknown or revoked) digests kept; the oldest go first. Valid ones are kept apart. */
const maxNegative = 10_000;

/**
 * The checks every request passes, RPC or plain HTTP: who is calling
 * (authenticate), whether the role may do this (authorize), whether a worker
 * token acts only for its own workers (actsFor), and the per-token rate
 * limit. The RPC request gate (server.ts, before the body is read), the RPC interceptor and the
 * plain-route dispatcher use it.
 *
 * Authentication is cheap for whatever cannot be a token: a missing or
 * malformed header, a value not shaped like a Meshwork token, or a digest
 * already found unknown or revoked is refused without a database lookup.
 * Lookups of one digest made together share one query. Valid tokens are
 * cached apart from the refused ones, so a flood of random tokens can never
 * evict them.
 */
export function createGuard(options: GuardOptions) {
  const cacheMs = options.cacheMs ?? 500;
  /** Valid tokens by digest, as last read (trusted for cacheMs, remembered as valid for longer). */
  const valid = new Map<string, { row: TokenRow; at: number }>();
  /** Digests found unknown or revoked: neither can become valid (tokens are 256 random bits). */
  const negative = new Map<string, true>();
  const inFlight = new Map<string, Promise<TokenRow | undefined>>();
  const limiter = createRateLimiter(options.rateLimit, options.rateBurst);
  const failures = createAuthFailures({
    rate: options.authFailureRate ?? 0,
    burst: options.authFailureBurst ?? 1,
    log: options.log,
  });
  const maxPending = options.maxPendingAuthBytes ?? 0;
  let pending = 0;
  const revocation = createStreamRevocation({
    revokedAmong: options.revokedAmong,
    log: options.log,
  });

  async function lookUp(digest: string, knownValid: boolean): Promise<TokenRow | undefined> {
    const known = inFlight.get(digest);
    if (known) return known;
    const store = knownValid ? (options.knownTokens ?? options.tokens) : options.tokens;
    const lookup = store.findByDigest(digest).finally(() => inFlight.delete(digest));
    inFlight.set(digest, lookup);
    const row = await lookup;
    if (row && !row.revokedAt) {
      valid.set(digest, { row, at: performance.now() });
      if (!row.lastUsedAt || Date.now() - row.lastUsedAt.getTime() > 60_000) {
        row.lastUsedAt = new Date();
        options.tokens.touch([row.id]).catch((error: unknown) => {
          options.log?.warn({ err: error }, "could not record a token's last use");
        });
      }
    } else {
      valid.delete(digest);
      if (negative.size >= maxNegative) {
        const [oldest] = negative.keys();
        if (oldest !== undefined) negative.delete(oldest);
      }
      negative.set(digest, true);
    }
    return row;
  }

  /** Refusals that need nothing from the request, made once: a flood of them allocates nothing. */
  const noToken = unauthenticated("a bearer token is required (Authorization: Bearer <token>)");
  const malformed = unauthenticated("the Authorization header must be 'Bearer <token>'");
  const notValid = unauthenticated("the bearer token is not valid");
  const busy = new DomainError(
    "unavailable",
    "AUTH_BUSY",
    "too many requests are waiting for their token to be checked; retry",
    { retryAfterMs: 1000 },
  );
  const throttledBySeconds = new Map<number, DomainError>();
  const throttled = (waitMs: number) => {
    const seconds = Math.ceil(waitMs / 1000);
    let e = throttledBySeconds.get(seconds);
    if (!e) {
      e = new DomainError(
        "resource_exhausted",
        "AUTH_THROTTLED",
        `too many failed authentications from this address: retry in ${seconds} s`,
        { retryAfterMs: seconds * 1000 },
      );
      throttledBySeconds.set(seconds, e);
    }
    return e;
  };

  function failed(
    why: AuthFailure,
    asker: Asker,
    error: DomainError,
    charged = false,
  ): DomainError {
    options.onFailure?.(why);
    if (why !== "busy") failures.record(asker.source, why, charged);
    asker.onRefused?.(why === "throttled");
    return error;
  }

  /** The caller a valid token names; its connection is told it carries a valid token. */
  const trusted = (row: TokenRow, asker: Asker): Principal => {
    asker.onAuthenticated?.();
    return { tokenId: row.id, name: row.name, role: row.role };
  };

  /**
   * What the headers alone decide, at once: the caller (a token trusted
   * from the cache), a refusal (counted and logged as a failure), or the
   * digest to look up. The refusals are shared instances: this is the path
   * every request without a valid token takes.
   */
  function decide(
    authorization: string | null | undefined,
    asker: Asker,
  ): Principal | DomainError | { digest: string; known: boolean } {
    if (!options.enabled) return anonymousAdmin;
    const m = authorization ? bearer.exec(authorization) : null;
    const secret = m?.[1] ?? "";
    const digest = isTokenShaped(secret) ? digestOf(secret) : "";
    const known = digest ? valid.get(digest) : undefined;
    // A source past its budget is looked up for no token but a known valid one.
    const wait = known ? 0 : failures.throttled(asker.source);
    if (wait > 0) return failed("throttled", asker, throttled(wait));
    if (!authorization) return failed("missing", asker, noToken);
    if (!m) return failed("malformed", asker, malformed);
    if (!digest || negative.has(digest)) return failed("invalid", asker, notValid);
    if (known && performance.now() - known.at < cacheMs) return trusted(known.row, asker);
    return { digest, known: known !== undefined };
  }

  return {
    enabled: options.enabled,

    /**
     * What the Authorization header alone decides, synchronously: the
     * caller, a refusal to answer with, or undefined when only a lookup can
     * tell (then `authenticate`).
     */
    precheck(
      authorization: string | null | undefined,
      asker: Asker = {},
    ): Principal | DomainError | undefined {
      const r = decide(authorization, asker);
      return "digest" in r ? undefined : r;
    },

    /**
     * The caller of a request with this Authorization header; `unauthenticated`
     * without a valid token. With `asker.source`, failures count against the
     * source's budget and past it the answer is `resource_exhausted` (429,
     * retry-after) with no lookup; with `asker.mayBuffer`, a lookup waits
     * only while the bytes such requests may buffer stay under the cap
     * (`unavailable` beyond it).
     */
    async authenticate(
      authorization: string | null | undefined,
      asker: Asker = {},
    ): Promise<Principal> {
      const { source } = asker;
      const r = decide(authorization, asker);
      if (r instanceof DomainError) throw r;
      if (!("digest" in r)) return r;
      // A lookup is paid for by the request that starts it: requests with the
      // same digest that arrive meanwhile wait for it at no cost (a fleet
      // starting at once with one new token is one lookup, not a refusal).
      const joined = inFlight.get(r.digest);
      const reserve = joined ? 0 : (asker.mayBuffer ?? 0);
      if (maxPending > 0 && reserve > 0 && pending + reserve > maxPending) {
        throw failed("busy", asker, busy);
      }
      // A token not known to be valid is charged to its source before the
      // lookup, so that many at once cannot overdraw the budget.
      const charged = !r.known && !joined;
      if (charged) {
        const wait = failures.charge(source);
        if (wait > 0) throw failed("throttled", asker, throttled(wait), true);
      }
      pending += reserve;
      let row: TokenRow | undefined;
      try {
        row = await (joined ?? lookUp(r.digest, r.known));
      } catch (error) {
        // The database failed, not the token: the source is not charged for it.
        if (charged) failures.refund(source);
        throw error;
      } finally {
        pending -= reserve;
      }
      // The lookup was by digest; compare again in constant time.
      const same =
        row !== undefined &&
        timingSafeEqual(Buffer.from(row.digest, "hex"), Buffer.from(r.digest, "hex"));
      if (!same || !row || row.revokedAt) throw failed("invalid", asker, notValid, charged);
      if (charged) failures.refund(source);
      return trusted(row, asker);
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

    /**
     * Holds a stream open for `principal`'s token: the returned signal
     * aborts, with `unauthenticated`, within a second of the token's
     * revocation on any replica (revocation.ts). Release it when the stream ends.
     */
    watch: revocation.watch,
    /** Streams held open for tokens now (tests: each one's registration ends with it). */
    heldStreams: revocation.open,

    /** Stops the revocation checks and flushes the failure log (the app's stop). */
    stop(): void {
      revocation.stop();
      failures.flush();
    },
  };
}

export type Guard = ReturnType<typeof createGuard>;
