import type { TaskRow } from "../db/schema/index.js";

/** The kinds of refusal Meshwork answers with; rpc/errors.ts maps each to a Connect code. */
export type ErrorKind =
  | "invalid_argument"
  | "unauthenticated"
  | "permission_denied"
  | "not_found"
  | "already_exists"
  | "aborted"
  | "failed_precondition"
  | "resource_exhausted"
  | "unavailable"
  | "data_loss";

/**
 * The one error type of the domain: a refusal a client may see. Validators
 * and stores throw it; `reason` is the machine-readable cause (e.g.
 * STALE_ATTEMPT); the message never holds SQL, parameters, paths or tokens.
 * Anything else thrown is a bug and reaches a client as `internal`.
 */
export class DomainError extends Error {
  override readonly name = "DomainError";
  constructor(
    readonly kind: ErrorKind,
    readonly reason: string,
    message: string,
    readonly details: {
      taskId?: string;
      currentAttempt?: number;
      task?: TaskRow;
      /** When to try again (rate limits): sent as `retry-after`, in seconds. */
      retryAfterMs?: number;
    } = {},
  ) {
    super(message);
  }
}

/** Shorthand for a bad-input refusal. */
export function invalid(message: string, reason = "INVALID_ARGUMENT"): DomainError {
  return new DomainError("invalid_argument", reason, message);
}

/**
 * No usable credentials. The message is the same whether a token is unknown,
 * revoked or malformed in its value: it never says whether a token exists.
 */
export function unauthenticated(message = "a valid bearer token is required"): DomainError {
  return new DomainError("unauthenticated", "UNAUTHENTICATED", message);
}

/** A valid token that may not do this, or that acts for another token's worker. */
export function permissionDenied(message: string, reason = "PERMISSION_DENIED"): DomainError {
  return new DomainError("permission_denied", reason, message);
}

/** `not_found` for a task, worker, artifact or entry, named in the message. */
export function notFound(what: string, details: DomainError["details"] = {}): DomainError {
  return new DomainError("not_found", "NOT_FOUND", `${what} not found`, details);
}
