import { onTestFinished } from "vitest";
import type { Db } from "../../src/db/database.js";
import { type PrepareQuery, wrapPrepareQuery } from "../../src/db/prepare-hook.js";

const mark = Symbol("test.statementFaults");

/** Armed faults by prepared statement name: how many runs still fail, and with what. */
const armed = new Map<string, { runs: number; error: () => Error }>();

/**
 * Makes the next `runs` runs of the prepared statement `name` fail with
 * `error()` before reaching the database, on every store of `db`'s driver
 * that prepares it after this call (a store prepares each statement once,
 * on first use: make the store after arming), until the current test ends.
 * Returns how many runs have failed so far.
 */
export function failStatement(
  db: Db,
  name: string,
  error: () => Error,
  runs = 1,
): { failed(): number } {
  wrapPrepareQuery(
    db._.session.constructor,
    mark,
    (original: PrepareQuery): PrepareQuery =>
      function (this: unknown, query, fields, statementName, ...rest) {
        const prepared = original.call(this, query, fields, statementName, ...rest) as {
          execute(values?: unknown): Promise<unknown>;
        };
        const fault = typeof statementName === "string" ? armed.get(statementName) : undefined;
        if (!fault) return prepared;
        const execute = prepared.execute.bind(prepared);
        prepared.execute = async (values?: unknown) => {
          if (fault.runs > 0) {
            fault.runs--;
            throw fault.error();
          }
          return execute(values);
        };
        return prepared;
      },
  );
  const fault = { runs, error };
  armed.set(name, fault);
  // A fault the test did not use up would fail the next store to prepare the statement.
  onTestFinished(() => {
    if (armed.get(name) === fault) armed.delete(name);
  });
  return { failed: () => runs - fault.runs };
}

/** A lost connection, as postgres.js reports one: transient, and no answer from the database. */
export const connectionReset = () =>
  Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET", syscall: "read" });
