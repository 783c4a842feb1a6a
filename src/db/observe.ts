/**
 * Who wants to know about each database statement: the metrics (statement
 * latency) and the tracing (a span per statement). The database layer calls
 * `started` as a statement is sent and the function it returns when the
 * statement settles; observers see only the statement's short name
 * (`insert into tasks`, `select meshwork_claim`: statementName below),
 * never its SQL text or parameters.
 */
export interface StatementObserver {
  /** A statement was sent; the function returned is called once when it settles. */
  started(statement: string): (error?: unknown) => void;
}

export interface StatementEvents extends StatementObserver {
  /** Adds an observer; returns its removal. */
  observe(observer: StatementObserver): () => void;
}

const nothing = () => {};

/** A business refusal thrown through a transaction (core's DomainError; db/ cannot import it). */
function isRefusal(error: unknown): boolean {
  return error instanceof Error && error.name === "DomainError";
}

export function createStatementEvents(): StatementEvents {
  const observers = new Set<StatementObserver>();
  return {
    observe(observer) {
      observers.add(observer);
      return () => observers.delete(observer);
    },
    started(statement) {
      if (observers.size === 0) return nothing;
      const ends = [...observers].map((o) => o.started(statement));
      return (error) => {
        // A transaction that a store ended by throwing a refusal (a
        // DomainError: an idempotency conflict, a fenced lease) succeeded as
        // far as the database is concerned: not a statement error.
        const failed = isRefusal(error) ? undefined : error;
        for (const end of ends) end(failed);
      };
    },
  };
}

/**
 * A short name for a statement: its verb and the table or function it is
 * about (`insert into tasks`, `select meshwork_claim`, `select from
 * workers`). SQL text holds placeholders only, but it can be long.
 */
export function statementName(query: string): string {
  // The verb and the table come first: a multi-row insert's megabyte of
  // placeholders need not be read.
  // `extract(epoch from now() …)` names no table: left in, it read as a
  // call of now() in the FROM clause.
  const q = query
    .slice(0, 2048)
    .replace(/\s+/g, " ")
    .toLowerCase()
    .replace(/\bextract\( ?[a-z]+ from /g, "extract(");
  const name = (s: string | undefined) => (s ?? "?").replaceAll('"', "");
  const write = /\b(insert into|update|delete from) ("?[a-z_][a-z0-9_]*"?)/.exec(q);
  if (write) return `${write[1]} ${name(write[2])}`;
  const call =
    /^select ("?[a-z_][a-z0-9_]*"?)\(/.exec(q) ?? /\bfrom ("?[a-z_][a-z0-9_]*"?)\(/.exec(q);
  if (call) return `select ${name(call[1])}`;
  const from = /\bfrom ("?[a-z_][a-z0-9_]*"?)/.exec(q);
  if (from) return `select from ${name(from[1])}`;
  return (/^[a-z]+/.exec(q)?.[0] ?? "statement").slice(0, 20);
}

const names = new Map<string, string>();

/**
 * The short name of a statement (statementName), remembered per SQL
 * text: the texts are the code's own, few and reused, and naming one costs
 * a few regular expressions. Past 1000 texts (IN lists of every length),
 * names are computed and not kept; nor is a text over 4 KiB (a multi-row
 * insert has one per row count, each up to a megabyte).
 */
export function namedStatement(query: string): string {
  let name = names.get(query);
  if (name === undefined) {
    name = statementName(query);
    if (names.size < 1000 && query.length <= 4096) names.set(query, name);
  }
  return name;
}

/**
 * Reports each query and transaction of a PGlite client to `statements`,
 * by wrapping its `query`, `exec` and `transaction` (the statements inside a
 * transaction are observed as the transaction). Returns how many are in
 * flight: PGlite has one connection, so one runs and the rest wait.
 */
export function observePglite(
  client: {
    query: (...args: never[]) => Promise<unknown>;
    exec: (...args: never[]) => Promise<unknown>;
    transaction: (...args: never[]) => Promise<unknown>;
  },
  statements: StatementObserver,
): () => number {
  let inFlight = 0;
  const wrap = <F extends (...args: never[]) => Promise<unknown>>(
    fn: F,
    nameOf: (args: Parameters<F>) => string,
  ): F =>
    (async (...args: Parameters<F>) => {
      inFlight++;
      const end = statements.started(nameOf(args));
      try {
        const result = await fn(...args);
        end();
        return result;
      } catch (error) {
        end(error);
        throw error;
      } finally {
        inFlight--;
      }
    }) as F;
  const text = (args: unknown[]) => (typeof args[0] === "string" ? namedStatement(args[0]) : "?");
  client.query = wrap(client.query.bind(client), text);
  client.exec = wrap(client.exec.bind(client), text);
  client.transaction = wrap(client.transaction.bind(client), () => "transaction");
  return () => inFlight;
}
