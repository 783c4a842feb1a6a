import type { TaskRow } from "./schema/index.js";

/** The kinds of refusal a store can answer with; rpc/ maps each to a Connect code. */
export type StoreErrorKind =
  | "invalid_argument"
  | "not_found"
  | "already_exists"
  | "aborted"
  | "failed_precondition"
  | "resource_exhausted";

/**
 * The one error type stores throw. `reason` is the machine-readable cause
 * (e.g. STALE_ATTEMPT); the message is safe to show a client: it never holds
 * SQL, parameters, paths or tokens.
 */
export class StoreError extends Error {
  override readonly name = "StoreError";
  constructor(
    readonly kind: StoreErrorKind,
    readonly reason: string,
    message: string,
    readonly details: { taskId?: string; currentAttempt?: number; task?: TaskRow } = {},
  ) {
    super(message);
  }
}
