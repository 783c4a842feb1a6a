import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";
import { TaskSchema } from "../../gen/meshwork/v1/task_pb.js";
import { StoreError, type StoreErrorKind } from "../db/errors.js";
import { toTask } from "../tasks/convert.js";

/** The one table from a store's refusal to a Connect code (SPEC section 6). */
export const codeOfKind: Record<StoreErrorKind, Code> = {
  invalid_argument: Code.InvalidArgument,
  not_found: Code.NotFound,
  already_exists: Code.AlreadyExists,
  aborted: Code.Aborted,
  failed_precondition: Code.FailedPrecondition,
  resource_exhausted: Code.ResourceExhausted,
};

/** HTTP status of a Connect code, for the plain HTTP routes. */
export const httpStatusOfCode: Partial<Record<Code, number>> = {
  [Code.InvalidArgument]: 400,
  [Code.Unauthenticated]: 401,
  [Code.PermissionDenied]: 403,
  [Code.NotFound]: 404,
  [Code.Aborted]: 409,
  [Code.AlreadyExists]: 409,
  [Code.FailedPrecondition]: 400,
  [Code.ResourceExhausted]: 429,
  [Code.Unimplemented]: 501,
  [Code.Unavailable]: 503,
  [Code.Canceled]: 499,
  [Code.DeadlineExceeded]: 504,
};

/** Connect's lower_snake name of a code, e.g. `already_exists`. */
export function codeName(code: Code): string {
  return Code[code].replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
}

/** Shorthand for a bad-input error. */
export function invalid(message: string, reason = "INVALID_ARGUMENT"): StoreError {
  return new StoreError("invalid_argument", reason, message);
}

/** A ConnectError for a store refusal, with an ErrorInfo detail carrying the reason. */
export function connectErrorOf(error: StoreError): ConnectError {
  const info = create(ErrorInfoSchema, {
    reason: error.reason,
    taskId: error.details.taskId ?? "",
    currentAttempt: error.details.currentAttempt ?? 0,
  });
  const details: ConstructorParameters<typeof ConnectError>[3] = [
    { desc: ErrorInfoSchema, value: info },
  ];
  // A placement conflict carries the task as it is (SPEC section 5).
  if (error.details.task) details.push({ desc: TaskSchema, value: toTask(error.details.task) });
  return new ConnectError(error.message, codeOfKind[error.kind], undefined, details);
}

/**
 * Turns anything thrown by a handler into what a client may see: a store
 * refusal keeps its code and reason; a ConnectError raised on purpose stays
 * as it is; anything else becomes `internal` with the message "internal
 * error" (the cause goes to the log only). `unexpected` is true in that last case.
 */
export function toClientError(error: unknown): { error: ConnectError; unexpected: boolean } {
  if (error instanceof StoreError) return { error: connectErrorOf(error), unexpected: false };
  if (error instanceof ConnectError) {
    if (error.code === Code.Internal || error.code === Code.Unknown) {
      return { error: new ConnectError("internal error", Code.Internal), unexpected: true };
    }
    return { error, unexpected: false };
  }
  return { error: new ConnectError("internal error", Code.Internal), unexpected: true };
}
