import { create, type Message } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";
import { type Task, TaskSchema } from "../../gen/meshwork/v1/task_pb.js";
import { BlobStoreUnavailable, isStorageFull, storageFull } from "../artifacts/blob-unavailable.js";
import { DomainError } from "../core/errors.js";
import { codeOfKind } from "../core/refusals.js";
import { isTransientDatabaseError } from "../db/faults.js";
import type { TaskRow } from "../db/schema/index.js";

/**
 * What connect-es 2.2 and connect-node say, with code `internal`, about
 * request bytes they cannot decode: a message that is not valid binary
 * protobuf, a body that does not decompress, a compressed envelope without
 * an encoding. JSON that does not parse is already `invalid_argument`.
 */
const undecodable = [
  /^parse binary: /,
  /^decompression failed$/,
  /^received compressed envelope, but do not know how to decompress$/,
];

/** A request the caller sent undecodable: its error, `invalid_argument`, never the server's. */
export function isUndecodableRequest(error: unknown): error is ConnectError {
  return (
    error instanceof ConnectError &&
    error.code === Code.Internal &&
    undecodable.some((r) => r.test(error.rawMessage))
  );
}

/** Half of a UTF-16 surrogate pair, alone. */
const loneSurrogate = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/**
 * Fixes, in place, an error connect-es 2.2 is about to send:
 * - an undecodable request gets its code, `invalid_argument`;
 * - a message with a lone surrogate (half of a character a client sent,
 *   quoted by a JSON parser or a refusal) gets U+FFFD in its place: gRPC
 *   and gRPC-Web percent-encode the message, encodeURIComponent throws on
 *   a lone surrogate, and the call would never be answered.
 * For unary RPCs connect-es decodes the request before any interceptor runs
 * and serializes the error itself; it passes every error to the call's
 * `abort` right before serializing it (see server.ts, requestGate), the one
 * place that sees them all.
 */
export function fixForWire(error: unknown): void {
  if (!(error instanceof ConnectError)) return;
  if (isUndecodableRequest(error)) (error as { code: Code }).code = Code.InvalidArgument;
  const message = error.rawMessage.replace(loneSurrogate, "\ufffd");
  if (message !== error.rawMessage) (error as { rawMessage: string }).rawMessage = message;
}

/**
 * A database that cannot be reached or cannot run the statement just now:
 * `unavailable` (503), retry in a second. Not `internal`: it is no bug, and
 * the same call may succeed on retry.
 */
export function databaseUnavailable(): ConnectError {
  return new ConnectError("the database is unavailable for a moment; retry", Code.Unavailable, {
    "retry-after": "1",
  });
}

/**
 * The blob store (S3, …) cannot be reached or cannot serve just now:
 * `unavailable` (503), retry in a second. The cause is logged, never sent:
 * it may name the endpoint.
 */
export function blobStoreUnavailable(): ConnectError {
  return new ConnectError(
    "the artifact store is unavailable for a moment; retry",
    Code.Unavailable,
    { "retry-after": "1" },
  );
}

/** The longest refusal message sent or logged, in characters. */
export const maxMessageLength = 512;

/**
 * A refusal's message cut to maxMessageLength: messages quote what the
 * caller sent (a name, a field), and a 5,000-character name must not make a
 * 5 KB answer and log line.
 */
export function bounded(message: string): string {
  return message.length <= maxMessageLength
    ? message
    : `${message.slice(0, maxMessageLength - 1)}…`;
}

/** The public form of a task, for errors that carry one (given by the caller: tasks/convert.ts). */
export type TaskEncoder = (row: TaskRow) => Task;

/**
 * Maps what handlers throw to what a client may see. A domain refusal keeps
 * its code and gets an ErrorInfo detail with its reason (and the task as it
 * is, when the refusal carries one: a placement conflict); a ConnectError
 * raised on purpose stays as it is; anything else becomes `internal` with
 * the message "internal error" (the cause goes to the log only) and
 * `unexpected` true. A request that cannot be decoded is
 * `invalid_argument` (isUndecodableRequest).
 */
export function createErrorMapper(encodeTask: TaskEncoder) {
  function connectErrorOf(error: DomainError): ConnectError {
    const info = create(ErrorInfoSchema, {
      reason: error.reason,
      taskId: error.details.taskId ?? "",
      currentAttempt: error.details.currentAttempt ?? 0,
    });
    const details: { desc: typeof ErrorInfoSchema | typeof TaskSchema; value: Message }[] = [
      { desc: ErrorInfoSchema, value: info },
    ];
    if (error.details.task)
      details.push({ desc: TaskSchema, value: encodeTask(error.details.task) });
    const retryAfter = error.details.retryAfterMs;
    return new ConnectError(
      bounded(error.message),
      codeOfKind(error.kind),
      retryAfter === undefined
        ? undefined
        : { "retry-after": String(Math.ceil(retryAfter / 1000)) },
      details as ConstructorParameters<typeof ConnectError>[3],
    );
  }

  return function toClientError(error: unknown): { error: ConnectError; unexpected: boolean } {
    if (error instanceof DomainError) return { error: connectErrorOf(error), unexpected: false };
    // Before the database check: a blob store's socket error (ECONNREFUSED)
    // in the cause chain would otherwise read as the database's.
    if (error instanceof BlobStoreUnavailable) {
      return { error: blobStoreUnavailable(), unexpected: false };
    }
    if (isTransientDatabaseError(error)) {
      return { error: databaseUnavailable(), unexpected: false };
    }
    // The database's disk is full (SQLSTATE 53100): nothing was written.
    if (isStorageFull(error)) {
      return { error: connectErrorOf(storageFull("the database")), unexpected: false };
    }
    if (isUndecodableRequest(error)) {
      // Streaming RPCs decode their messages while the handler reads them.
      return { error: new ConnectError(error.rawMessage, Code.InvalidArgument), unexpected: false };
    }
    if (error instanceof ConnectError) {
      if (error.code === Code.Internal || error.code === Code.Unknown) {
        return { error: new ConnectError("internal error", Code.Internal), unexpected: true };
      }
      return { error, unexpected: false };
    }
    return { error: new ConnectError("internal error", Code.Internal), unexpected: true };
  };
}

export type ToClientError = ReturnType<typeof createErrorMapper>;
