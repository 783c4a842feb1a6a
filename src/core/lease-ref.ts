import { invalid } from "./errors.js";
import { attemptField, uuidField } from "./validate.js";

/** What a lease-bound request names: (task_id, attempt) held by worker_id, maybe with its token. */
export interface LeaseRef {
  taskId: string;
  workerId: string;
  attempt: number;
  /** Empty when the caller did not send one. */
  token: string;
}

/** Lease tokens are 64 hex digits; anything longer than this cannot be one and is refused. */
export const maxTokenLength = 256;

/**
 * The one token rule: optional (empty = not sent), at most 256 characters.
 * A longer token is `invalid_argument`, never cut: a cut token would be
 * compared as if the client had sent it.
 */
export function leaseToken(field: string, value: string): string {
  if (value.length > maxTokenLength) {
    throw invalid(`${field} is longer than ${maxTokenLength} characters`);
  }
  return value;
}

/** The lease fields as every lease-bound request carries them (RPC messages, upload headers). */
export interface LeaseFields {
  taskId: string;
  workerId: string;
  attempt: number;
  leaseToken: string;
}

/** The one lease-reference parser. `prefix` names the place in a batch, e.g. `completions[2].`. */
export function parseLeaseRef(fields: LeaseFields, prefix = ""): LeaseRef {
  return {
    taskId: uuidField(`${prefix}task_id`, fields.taskId),
    workerId: uuidField(`${prefix}worker_id`, fields.workerId),
    attempt: attemptField(`${prefix}attempt`, fields.attempt),
    token: leaseToken(`${prefix}lease_token`, fields.leaseToken),
  };
}
