import type { TaskRow } from "../db/schema/index.js";
import type { Reason, ReasonOf, refusals } from "./refusals.js";

/**
 * The one error type of the domain: a refusal a client may see. Validators
 * and stores throw it; `reason` is the machine-readable cause, a name from
 * the refusal table (core/refusals.ts), and `kind` must be that reason's
 * code there: the compiler checks both at every throw site. The message
 * never holds SQL, parameters, paths or tokens. Anything else thrown is a
 * bug and reaches a client as `internal`.
 */
export class DomainError<R extends Reason = Reason> extends Error {
  override readonly name = "DomainError";
  constructor(
    readonly kind: NoInfer<(typeof refusals)[R]["kind"]>,
    readonly reason: R,
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
export function invalid(
  message: string,
  reason: ReasonOf<"invalid_argument"> = "INVALID_ARGUMENT",
): DomainError {
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
export function permissionDenied(
  message: string,
  reason: ReasonOf<"permission_denied"> = "PERMISSION_DENIED",
): DomainError {
  return new DomainError("permission_denied", reason, message);
}

/** `not_found` for a task, worker, artifact or entry, named in the message. */
export function notFound(what: string, details: DomainError["details"] = {}): DomainError {
  return new DomainError("not_found", "NOT_FOUND", `${what} not found`, details);
}
