import type postgres from "postgres";
import { namedStatement, type StatementObserver } from "./observe.js";

/** Defaults of the PostgreSQL pool options (README: Configuration). */
export const poolDefaults = { poolSize: 10, acquireTimeoutMs: 3000, statementTimeoutMs: 30_000 };

/**
 * Thrown when no pool connection became free within the acquire timeout:
 * the pool is exhausted (statements blocked on a lock, a slow database, a
 * burst larger than the pool can drain). Transient (db/faults.ts): the
 * client gets `unavailable` and retries.
 */
export class PoolExhaustedError extends Error {
  override readonly name = "PoolExhaustedError";
  readonly code = "POOL_EXHAUSTED";
}

/**
 * A counting semaphore with FIFO waiters and a bound on the wait: at most
 * `capacity` holders; a caller that waits longer than `timeoutMs` for a
 * slot is refused with PoolExhaustedError instead of queueing forever.
 *
 * `reserved` of the slots are kept for the urgent lane (`run(fn, true)`):
 * lease renewals, stream messages and completions, which a worker needs to
 * keep what it holds, and the fleet's status, which its operator needs to
 * see what happens. Other work (claims, creates, reads) takes a slot only
 * while more than `reserved` are free, so a burst of it can never leave a
 * renewal waiting until its lease runs out. A freed slot goes to an urgent
 * waiter first.
 */
export function createPoolGate(capacity: number, timeoutMs: number, reserved = 0) {
  let free = capacity;
  // Insertion-ordered: the first waiter of each lane is served first.
  const urgent = new Set<() => void>();
  const other = new Set<() => void>();
  const lane = (isUrgent: boolean) => (isUrgent ? urgent : other);
  const grantable = (isUrgent: boolean) => (isUrgent ? free > 0 : free > reserved);

  function acquire(isUrgent: boolean): Promise<void> {
    if (grantable(isUrgent) && lane(isUrgent).size === 0) {
      free--;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const grant = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        lane(isUrgent).delete(grant);
        reject(
          new PoolExhaustedError(
            `no database connection became free within ${timeoutMs} ms (all ${capacity} busy)`,
          ),
        );
      }, timeoutMs);
      lane(isUrgent).add(grant);
    });
  }

  function release(): void {
    free++;
    for (const isUrgent of [true, false]) {
      const waiting = lane(isUrgent);
      for (const next of waiting) {
        if (!grantable(isUrgent)) break;
        waiting.delete(next);
        free--;
        next();
      }
    }
  }

  async function run<T>(fn: () => PromiseLike<T>, isUrgent = false): Promise<T> {
    await acquire(isUrgent);
    try {
      return await fn();
    } finally {
      release();
    }
  }

  return {
    /** Runs `fn` holding one slot (any free one, when `isUrgent`); waits at most the timeout for it. */
    run,
    /** The urgent lane of this gate, as a gate of its own (for gatedClient). */
    urgent: { run: <T>(fn: () => PromiseLike<T>) => run(fn, true) },
    /** Slots free and callers waiting, for tests and logs. */
    stats(): { free: number; waiting: number } {
      return { free, waiting: urgent.size + other.size };
    },
  };
}

export type PoolGate = ReturnType<typeof createPoolGate>;

/**
 * The postgres.js client as Drizzle's postgres-js driver sees it, with every
 * statement and every transaction passing through `gate` first.
 *
 * postgres.js has no acquire timeout: with every connection busy it queues a
 * statement (or pipelines it behind a busy one) until a connection frees,
 * however long that takes. The gate, whose capacity is the pool size, keeps
 * the waiting on our side, where it is bounded.
 *
 * Drizzle 0.45 calls exactly two things on the client it is given:
 * `unsafe(query, params, options)` (awaited, or `.values()` then awaited)
 * and `begin(fn)` for `db.transaction`. Only those two are offered (plus
 * `options`, whose parsers Drizzle sets), so a future Drizzle that calls
 * anything else fails loudly instead of slipping past the gate.
 *
 * A transaction holds one slot from BEGIN to COMMIT; the statements inside
 * it run on the transaction's own client (postgres.js's TransactionSql,
 * which Drizzle gets from `begin`, savepoints included) and never go
 * through the gate again, so a transaction cannot wait for a second slot
 * while holding one. Code inside `withTx` must use the transaction's stores
 * (it does: stores.ts); a statement on the outer handle from inside a
 * transaction would need a second slot and could time out.
 *
 * Each statement is reported to `statements` (observe.ts) by its short
 * name once it holds a slot, so its time is the database's, not the wait;
 * a transaction is reported as a whole (`transaction`). The sweeper's
 * client, outside the pool, is passed `ungated`.
 */
export function gatedClient(
  client: postgres.Sql,
  gate: Pick<PoolGate, "run">,
  statements?: StatementObserver,
): postgres.Sql {
  const gated = {
    options: client.options,
    unsafe(query: string, params?: postgres.ParameterOrJSON<never>[], options?: object) {
      let values = false;
      let result: Promise<unknown> | undefined;
      // postgres.js queries are lazy: nothing is sent until they are awaited,
      // so creating the query inside the gate is what queues it there.
      const run = () => {
        result ??= gate.run(() => {
          const q = client.unsafe(query, params, options);
          return observed(statements, namedStatement(query), () => (values ? q.values() : q));
        });
        return result;
      };
      const pending = {
        values() {
          values = true;
          return pending;
        },
        // biome-ignore lint/suspicious/noThenProperty: a lazy query, as postgres.js's own
        then(onFulfilled?: (v: unknown) => unknown, onRejected?: (e: unknown) => unknown) {
          return run().then(onFulfilled, onRejected);
        },
        catch(onRejected?: (e: unknown) => unknown) {
          return run().catch(onRejected);
        },
        finally(onFinally?: () => void) {
          return run().finally(onFinally);
        },
      };
      return pending;
    },
    begin(...args: unknown[]) {
      return gate.run(() =>
        observed(statements, "transaction", () =>
          (client.begin as (...a: unknown[]) => Promise<unknown>)(...args),
        ),
      );
    },
  };
  return gated as unknown as postgres.Sql;
}

/** A gate that never waits: the sweeper's connection is outside the pool. */
export const ungated: Pick<PoolGate, "run"> = { run: async (fn) => fn() };

/** Runs `fn`, telling `statements` (when given) that `name` started and how it settled. */
async function observed<T>(
  statements: StatementObserver | undefined,
  name: string,
  fn: () => PromiseLike<T>,
): Promise<T> {
  if (!statements) return fn();
  const end = statements.started(name);
  try {
    const result = await fn();
    end();
    return result;
  } catch (error) {
    end(error);
    throw error;
  }
}
