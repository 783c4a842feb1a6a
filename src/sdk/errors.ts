import { Code, ConnectError } from "@connectrpc/connect";

// The errors of the SDK's public API, exported by worker.ts (meshwork/worker).

/**
 * An error a handler throws to choose the FailTask `error_code` and whether
 * another attempt may help. Any other error fails the task as retryable with
 * its `code` (when a string) or its `name`; an error with `retryable: false`
 * is not retried either.
 */
export class TaskError extends Error {
  readonly code: string;
  readonly retryable: boolean;
  constructor(
    code: string,
    message: string,
    options: { retryable?: boolean; cause?: unknown } = {},
  ) {
    super(message, { cause: options.cause });
    this.name = "TaskError";
    this.code = code;
    this.retryable = options.retryable ?? true;
  }
}

/** The reason of an aborted `ctx.signal`: the lease was lost, the task cancelled, or released on stop. */
export class LeaseEndedError extends Error {
  readonly kind: "lost" | "canceled" | "released";
  /** The coordinator's reason (LEASE_EXPIRED, STALE_ATTEMPT, TASK_CANCELED, …) or SHUTDOWN. */
  readonly reason: string;
  constructor(kind: "lost" | "canceled" | "released", reason: string) {
    super(`task lease ${kind}${reason ? ` (${reason})` : ""}`);
    this.name = "LeaseEndedError";
    this.kind = kind;
    this.reason = reason;
  }
}

/** Whether an error is the coordinator refusing the token (unauthenticated or permission_denied). */
export function isAuthError(error: unknown): boolean {
  return (
    error instanceof ConnectError &&
    (error.code === Code.Unauthenticated || error.code === Code.PermissionDenied)
  );
}
