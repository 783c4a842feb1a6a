/**
 * Who wants to know about each database statement: the metrics (statement
 * latency) and the tracing (a span per statement). The database layer calls
 * `started` as a statement is sent and the function it returns when the
 * statement settles; observers see only the statement's short name
 * (`insert into tasks`, `select meshwork_claim`: log.ts statementName),
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
        for (const end of ends) end(error);
      };
    },
  };
}
