/**
 * Whether a failed statement failed because the database could not be
 * reached or could not run it just now (a lost connection, a failover, a
 * server shutting down, too many connections, a statement timeout, a
 * serialization failure or deadlock, no pool connection free within the
 * acquire timeout), as opposed to a bug. Such a failure
 * is `unavailable` to clients, who retry; the same call may well succeed a
 * moment later. Errors are searched down their `cause` chain (Drizzle wraps
 * the driver's error).
 */
export function isTransientDatabaseError(error: unknown): boolean {
  for (const { code, syscall } of causeChain(error)) {
    if (typeof code === "string" && (transientCodes.has(code) || transientSqlState(code))) {
      return true;
    }
    // A Unix socket that is not there: the server is stopped or restarting
    // (PostgreSQL removes its socket file when it stops). Only a connect's:
    // a file missing elsewhere is no database fault.
    if (code === "ENOENT" && syscall === "connect") return true;
  }
  return false;
}

/**
 * `error` and the errors down its `cause` chain, outermost first, as long
 * as each is an object, six at most (Drizzle wraps the driver's error, and
 * a caller may wrap that).
 */
export function* causeChain(error: unknown): Generator<Record<string, unknown>> {
  let e: unknown = error;
  for (let depth = 0; depth < 6 && e !== null && typeof e === "object"; depth++) {
    const o = e as Record<string, unknown>;
    yield o;
    e = o.cause;
  }
}

/** Node's socket errors, postgres.js's own connection errors, and our pool gate's (pool-gate.ts). */
const transientCodes = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  "CONNECTION_CLOSED",
  "CONNECTION_ENDED",
  "CONNECTION_DESTROYED",
  "CONNECT_TIMEOUT",
  "POOL_EXHAUSTED",
]);

/**
 * SQLSTATEs: class 08 (connection exception), 57P01–57P03 (admin or crash
 * shutdown, cannot connect now), 57014 (statement timeout or cancel),
 * 53300 (too many connections), 40001 and 40P01 (serialization failure,
 * deadlock: the transaction may simply be retried), 55P03 (a lock not
 * granted within lock_timeout: a claim waits at most 2 s for a worker).
 */
function transientSqlState(code: string): boolean {
  return (
    (code.length === 5 && code.startsWith("08")) ||
    ["57P01", "57P02", "57P03", "57014", "53300", "40001", "40P01", "55P03"].includes(code)
  );
}

/**
 * Whether the database answered a statement with an error (a SQLSTATE):
 * that statement, alone in its transaction, then committed nothing. A
 * failure without an answer (the connection lost) may have committed.
 * Node's socket errors (EPIPE and the like) have five-letter codes too; no
 * SQLSTATE class begins with E.
 */
export function answeredWithError(error: unknown): boolean {
  for (const { code } of causeChain(error)) {
    if (typeof code === "string" && /^[0-9A-DF-Z][0-9A-Z]{4}$/.test(code)) return true;
  }
  return false;
}

/** SQLSTATE 40P01 (a deadlock) anywhere in the cause chain. */
export function isDeadlock(error: unknown): boolean {
  for (const { code } of causeChain(error)) if (code === "40P01") return true;
  return false;
}
