import type { Interceptor } from "@connectrpc/connect";
import { checkEachMessage } from "../rpc/interceptors.js";
import type { Guard } from "./guard.js";
import { adminOnly, openServices, policy } from "./policy.js";
import { kPreauthenticated, kPrincipal } from "./principal.js";

/**
 * Authentication and authorization for every RPC, unary and streaming, on
 * every protocol: the bearer token (guard.authenticate), the method's rule
 * (policy.ts), the per-token rate limit, and, for a worker token, that each
 * message acts only for workers registered with it — checked on every
 * message of a stream as it arrives, before the handler sees it. The caller
 * is put in the context (kPrincipal) for the handlers. A REST route's
 * in-process call brings its caller (kPreauthenticated), already
 * authenticated and counted by the route: only the rule and ownership are
 * checked again.
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
    const inspect = async (message: unknown) => {
      const m = message as Record<string, unknown>;
      const refused = rule.check?.(principal.role, m);
      if (refused) guard.authorize(principal, [], refused);
      if (rule.actsFor) await guard.actsFor(principal, rule.actsFor(m));
    };
    return next(await checkEachMessage(req, inspect));
  };
}
