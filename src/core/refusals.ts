import type { Code } from "@connectrpc/connect";
import { codeFromString } from "@connectrpc/connect/protocol-connect";

/**
 * A Connect code as the wire spells it (`codeToString`): the kind of a
 * refusal. Only the codes Meshwork refuses with on purpose; `internal` is
 * never a refusal (rpc/errors.ts).
 */
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

/** One reason a client can see in an ErrorInfo (errors.proto, `Reason`). */
export interface Refusal {
  /** The Connect code it is sent with. */
  readonly kind: ErrorKind;
  /**
   * The HTTP status on the plain routes and the REST contracts. It is
   * Connect's own (https://connectrpc.com/docs/protocol#error-codes) for the
   * code, but for STORAGE_FULL: see there.
   */
  readonly http: number;
  /** Whether the same request, sent again unchanged, may succeed later (after `retry-after` when sent). */
  readonly retryable: boolean;
  /** What it means, in one line (errors.proto says the same). */
  readonly doc: string;
}

const aborted = (doc: string) => ({ kind: "aborted", http: 409, retryable: false, doc }) as const;
const invalidInput = (doc: string) =>
  ({ kind: "invalid_argument", http: 400, retryable: false, doc }) as const;

/**
 * Every reason a client can see, with its code, HTTP status, retryability
 * and meaning: the one table. A reason is named by its key (`Reason`),
 * checked by the compiler wherever a DomainError is made or read, and
 * proto/meshwork/v1/errors.proto lists the same names (test/unit/refusals.test.ts).
 * The strings are wire names: clients switch on them; never rename one.
 */
export const refusals = {
  // A lease-bound request that does not hold the lease (core/lease-check.ts).
  STALE_ATTEMPT: aborted("the attempt is not the task's current one: the task was leased again"),
  FOREIGN_WORKER: aborted("the attempt is current but another worker holds its lease"),
  LEASE_EXPIRED: aborted("the lease ran out; the task may be handed to another worker"),
  TOKEN_MISMATCH: aborted("everything matches but the lease token"),
  TASK_CANCELED: aborted("the task was cancelled, which revoked its lease"),
  TIMEOUT: aborted(
    "the attempt ran past the task's timeout_seconds: it was failed (retried while attempts remain)",
  ),
  NOT_LEASED: aborted("the task holds no lease for this attempt (pending again, or finished)"),
  ARTIFACT_MISMATCH: aborted(
    "a result or checkpoint that is not an artifact of this task and attempt",
  ),
  ALREADY_ASSIGNED: aborted("the task is assigned already, under another placement key"),
  VERSION_CONFLICT: aborted("a knowledge entry at this version or newer is stored"),
  UPLOAD_EXPIRED: aborted("an upload that received nothing for too long was removed; upload again"),
  ARTIFACT_BYTES_REMOVED: aborted(
    "the stored bytes an upload matched were removed by retention meanwhile; upload again",
  ),

  IDEMPOTENCY_KEY_REUSED: {
    kind: "already_exists",
    http: 409,
    retryable: false,
    doc: "an idempotency key reused for a different request",
  },
  COMPLETION_CONFLICT: {
    kind: "already_exists",
    http: 409,
    retryable: false,
    doc: "the attempt was completed already, with a different manifest",
  },
  TOKEN_NAME_TAKEN: {
    kind: "already_exists",
    http: 409,
    retryable: false,
    doc: "a token of this name exists",
  },

  INVALID_STATE: {
    kind: "failed_precondition",
    http: 400,
    retryable: false,
    doc: "the task's state does not allow it (cancelling a finished task, …)",
  },
  NO_CANDIDATE: {
    kind: "failed_precondition",
    http: 400,
    retryable: true,
    doc: "no registered worker fits a placement now; the message says why each does not",
  },

  NOT_FOUND: {
    kind: "not_found",
    http: 404,
    retryable: false,
    doc: "unknown task, worker, artifact or knowledge entry",
  },

  INVALID_ARGUMENT: invalidInput("a field out of its limits, malformed or missing"),
  INVALID_PAGE_TOKEN: invalidInput("a page token this coordinator did not issue for this listing"),
  INVALID_FILENAME: invalidInput("an artifact filename outside [A-Za-z0-9._-], or badly encoded"),
  CHECKSUM_MISMATCH: invalidInput("the uploaded bytes do not hash to the sha256 declared"),
  SIZE_MISMATCH: invalidInput("the uploaded bytes are not as many as declared"),
  FOREIGN_URI: invalidInput("a result uri that is not the coordinator-issued download URL"),

  UNAUTHENTICATED: {
    kind: "unauthenticated",
    http: 401,
    retryable: false,
    doc: "no bearer token, a malformed one, or one unknown or revoked (the same answer for each)",
  },
  PERMISSION_DENIED: {
    kind: "permission_denied",
    http: 403,
    retryable: false,
    doc: "the token's role may not do this",
  },
  FOREIGN_WORKER_TOKEN: {
    kind: "permission_denied",
    http: 403,
    retryable: false,
    doc: "a worker token acting for a worker registered with another token",
  },

  ARTIFACT_TOO_LARGE: {
    kind: "resource_exhausted",
    http: 429,
    retryable: false,
    doc: "an artifact over the size cap",
  },
  MESSAGE_TOO_LARGE: {
    kind: "resource_exhausted",
    http: 429,
    retryable: false,
    doc: "a REST body over the message size limit",
  },
  CONCURRENCY_LIMIT: {
    kind: "resource_exhausted",
    http: 429,
    retryable: true,
    doc: "a placement's concurrency_key is at its limit (ConcurrencyService); retry when one of its tasks ends",
  },
  KEY_RATE_LIMIT: {
    kind: "resource_exhausted",
    http: 429,
    retryable: true,
    doc: "a placement's rate_key has no token left now (ConcurrencyService); retry shortly",
  },
  RATE_LIMITED: {
    kind: "resource_exhausted",
    http: 429,
    retryable: true,
    doc: "the token is over its rate limit; retry after `retry-after` seconds",
  },
  AUTH_THROTTLED: {
    kind: "resource_exhausted",
    http: 429,
    retryable: true,
    doc: "the address is past its budget of failed authentications; retry after `retry-after`",
  },
  // 507 (Insufficient Storage), not Connect's 429: a client that backs off
  // on 429 as on a rate limit would retry into a full disk; 507 says the
  // coordinator's storage, not the caller, is the limit. gRPC and Connect
  // still see `resource_exhausted`.
  STORAGE_FULL: {
    kind: "resource_exhausted",
    http: 507,
    retryable: true,
    doc: "the storage had no room for the upload; nothing of it was kept",
  },

  AUTH_BUSY: {
    kind: "unavailable",
    http: 503,
    retryable: true,
    doc: "too many requests are waiting for their token to be checked; retry",
  },

  ARTIFACT_CORRUPT: {
    kind: "data_loss",
    http: 500,
    retryable: false,
    doc: "stored bytes no longer hash to their sha256; refused until they are uploaded again",
  },
} as const satisfies Record<string, Refusal>;

/** The name of a refusal, as ErrorInfo.reason carries it. */
export type Reason = keyof typeof refusals;

/** The reasons sent with one code, e.g. `ReasonOf<"aborted">`. */
export type ReasonOf<K extends ErrorKind> = {
  [R in Reason]: (typeof refusals)[R]["kind"] extends K ? R : never;
}[Reason];

/** The code of a refusal, from its kind. */
export function codeOfKind(kind: ErrorKind): Code {
  const code = codeFromString(kind);
  if (code === undefined) throw new Error(`no Connect code ${kind}`);
  return code;
}

/** The table entry of a reason a client sent back, or undefined for one this server never sends. */
export function refusalOf(reason: string): Refusal | undefined {
  return Object.hasOwn(refusals, reason) ? refusals[reason as Reason] : undefined;
}
