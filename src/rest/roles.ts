import { policy } from "../auth/policy.js";
import type { TokenRoleName } from "../db/schema/index.js";

/**
 * The roles a REST route admits before it runs: those of the RPCs it makes
 * (auth/policy.ts), so that a token the RPC would refuse is refused at the
 * door, before the body is read. The RPC checks again, with worker ownership.
 */
export function rolesOf(...methods: string[]): TokenRoleName[] {
  const roles = new Set<TokenRoleName>();
  for (const method of methods) {
    const rule = policy[`meshwork.v1.${method}`];
    if (!rule) throw new Error(`no auth rule for ${method}`);
    for (const role of rule.roles) roles.add(role);
  }
  return [...roles];
}
