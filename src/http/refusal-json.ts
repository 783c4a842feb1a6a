import { Code, type ConnectError } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";
import { refusalOf } from "../core/refusals.js";

/**
 * The HTTP status of a code on the plain routes, for an error without a
 * reason of the refusal table (the database or blob store unavailable,
 * `internal`, the transport's own): Connect's table
 * (https://connectrpc.com/docs/protocol#error-codes), the same for every
 * code. connect-es has it too, but marked internal (codeToHttpStatus);
 * test/unit/refusals.test.ts checks the refusal table against it.
 */
export const httpStatusOfCode: Partial<Record<Code, number>> = {
  [Code.Canceled]: 499,
  [Code.InvalidArgument]: 400,
  [Code.DeadlineExceeded]: 504,
  [Code.NotFound]: 404,
  [Code.AlreadyExists]: 409,
  [Code.PermissionDenied]: 403,
  [Code.ResourceExhausted]: 429,
  [Code.FailedPrecondition]: 400,
  [Code.Aborted]: 409,
  [Code.OutOfRange]: 400,
  [Code.Unimplemented]: 501,
  [Code.Unavailable]: 503,
  [Code.Unauthenticated]: 401,
};

/** A refusal's answer on the plain routes and the REST contracts. */
export interface RefusalJson {
  status: number;
  /** The ErrorInfo reason, when the error has one. */
  reason: string | undefined;
  body: { error: string; message: string; reason?: string };
}

/**
 * A client error (rpc/errors.ts, toClientError) as the plain routes and the
 * REST contracts send it: the status of its reason in the refusal table
 * (core/refusals.ts), else of its code, and `{"error": <code name>,
 * "message", "reason"}`; `reason` is left out when it says no more than the
 * code (INVALID_ARGUMENT).
 */
export function refusalJson(e: ConnectError): RefusalJson {
  const reason = e.findDetails(ErrorInfoSchema)[0]?.reason;
  const refusal = reason === undefined ? undefined : refusalOf(reason);
  return {
    status: refusal?.http ?? httpStatusOfCode[e.code] ?? 500,
    reason,
    body: {
      error: codeToString(e.code),
      message: e.rawMessage,
      ...(reason && reason !== "INVALID_ARGUMENT" && { reason }),
    },
  };
}
