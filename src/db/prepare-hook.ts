/**
 * A Drizzle session's `prepareQuery`, as its classes (PgliteSession,
 * PostgresJsSession) declare it: the query, its selected fields, the
 * statement's name, whether rows come as arrays, a mapper of the rows
 * (relational queries pass theirs), and what a driver adds after those.
 */
export type PrepareQuery = (
  query: { sql: string },
  fields: unknown,
  name: unknown,
  isResponseInArrayMode: unknown,
  customResultMapper: unknown,
  ...rest: unknown[]
) => unknown;

/**
 * Replaces a Drizzle session class's `prepareQuery` with `wrap(original)`,
 * once per class and `mark`: a second call with the same mark is a no-op,
 * so that a wrapper is never stacked on itself. The mark is looked for on
 * the class's own prototype only, so a subclass of a wrapped class can be
 * wrapped as well (its `prepareQuery` then goes through both).
 */
export function wrapPrepareQuery(
  session: { prototype: object },
  mark: symbol,
  wrap: (original: PrepareQuery) => PrepareQuery,
): void {
  const proto = session.prototype as { prepareQuery: PrepareQuery };
  if (Object.hasOwn(proto, mark)) return;
  proto.prepareQuery = wrap(proto.prepareQuery);
  Object.defineProperty(proto, mark, { value: true });
}
