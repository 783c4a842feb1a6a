import type { Interceptor } from "@connectrpc/connect";
import type { Guard } from "../auth/guard.js";
import { adminOnly, openServices, policy } from "../auth/policy.js";
import { kPreauthenticated, kPrincipal } from "../auth/principal.js";
import { checkEachMessage } from "./interceptors.js";

/**
 * Authentication and authorization for every RPC, unary and streaming, on
 * every protocol: the bearer token (guard.authenticate), the method's rule
 * (policy.ts), the per-token rate limit, and, for a worker token, that each
 * message acts only for workers registered with it — checked on every
 * message of a stream as it arrives, before the handler sees it. The caller
 * is put in the context (kPrincipal) for the handlers. A call that comes
 * with its caller (kPreauthenticated: a REST route's in-process call, or a
 * network call whose token the request gate checked from its headers before
 * its body was read, server.ts) was authenticated and counted already:
 * only the rule and ownership are checked again.
 *
 * A stream is held for its token (guard.watch): when the token is revoked,
 * the stream ends with `unauthenticated` within a second, whatever the
 * handler is waiting for, and no further message of it is taken.
 */
export function createAuthInterceptor(guard: Guard): Interceptor {
  return (next) => async (req) => {
    if (openServices.has(req.service.typeName)) return next(req);
    const key = `${req.service.typeName}/${req.method.name}`;
    const given = req.contextValues.get(kPreauthenticated);
    const principal = given ?? (await guard.authenticate(req.header.get("authorization")));
    const rule = policy[key] ?? adminOnly;
    guard.authorize(principal, rule.roles, `call ${key}`);
    if (!given) guard.rateLimit(principal);
    req.contextValues.set(kPrincipal, principal);
    const watch = req.stream ? guard.watch(principal.tokenId) : undefined;
    const inspect = async (message: unknown) => {
      if (watch?.signal.aborted) throw watch.signal.reason;
      const m = message as Record<string, unknown>;
      const refused = rule.check?.(principal.role, m);
      if (refused) guard.authorize(principal, [], refused);
      if (rule.actsFor) await guard.actsFor(principal, rule.actsFor(m));
    };
    if (!watch) return next(await checkEachMessage(req, inspect));
    try {
      const res = await next(await checkEachMessage(req, inspect));
      if (!res.stream) {
        watch.release();
        return res;
      }
      return { ...res, message: endOnAbort(res.message, watch) };
    } catch (error) {
      watch.release();
      throw error;
    }
  };
}

/**
 * The messages of a response stream, ended with the signal's reason as soon
 * as it aborts, even while the handler waits for something else (the next
 * message of a bidi stream, a task change). The handler is asked to return,
 * not awaited: it may be parked until its own wait ends.
 */
async function* endOnAbort<T>(
  messages: AsyncIterable<T>,
  watch: { signal: AbortSignal; release(): void },
): AsyncGenerator<T> {
  const { signal } = watch;
  const it = messages[Symbol.asyncIterator]();
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
  });
  aborted.catch(() => {});
  let finished = false;
  try {
    for (;;) {
      const r = await Promise.race([it.next(), aborted]);
      if (r.done) {
        finished = true;
        return;
      }
      yield r.value;
    }
  } finally {
    if (onAbort) signal.removeEventListener("abort", onAbort);
    watch.release();
    if (!finished) it.return?.().catch(() => {});
  }
}
