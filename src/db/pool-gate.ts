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
 */
export function createPoolGate(capacity: number, timeoutMs: number) {
  let free = capacity;
  // Insertion-ordered: the first waiter is served first.
  const waiters = new Set<() => void>();

  function acquire(): Promise<void> {
    if (free > 0 && waiters.size === 0) {
      free--;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const grant = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        waiters.delete(grant);
        reject(
          new PoolExhaustedError(
            `no database connection became free within ${timeoutMs} ms (all ${capacity} busy)`,
          ),
        );
      }, timeoutMs);
      waiters.add(grant);
    });
  }

  function release(): void {
    const [next] = waiters;
    if (next) {
      // The slot passes straight to the next waiter: `free` stays as it is.
      waiters.delete(next);
      next();
    } else {
      free++;
    }
  }

  return {
    /** Runs `fn` holding one slot; waits at most the timeout for it. */
    async run<T>(fn: () => PromiseLike<T>): Promise<T> {
      await acquire();
      try {
        return await fn();
      } finally {
        release();
      }
    },
    /** Slots free and callers waiting, for tests and logs. */
    stats(): { free: number; waiting: number } {
      return { free, waiting: waiters.size };
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
