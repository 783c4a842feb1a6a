import {
  type PGlite,
  parse,
  protocol,
  type QueryOptions,
  type Results,
  type Transaction,
} from "@electric-sql/pglite";

/**
 * Named statements for PGlite, as postgres.js keeps them on PostgreSQL.
 *
 * PGlite's `query` sends every statement unnamed: each run is parsed,
 * analysed and planned again (a completion's update, with the task row it
 * returns, plans in about 0.8 ms there), in six calls into the database.
 * Here a text the coordinator runs a second time is prepared under a name
 * of its own (Parse, Describe), and each run after that is one call: Bind,
 * Describe, Execute, Sync. PostgreSQL's plan cache then treats it as it
 * treats a prepared statement of postgres.js (custom plans for its first
 * runs, a generic plan where that costs no more).
 *
 * Kept: the last `capacity` texts used; one longer than `longest`
 * characters (an insert of many rows, one text per row count) is never
 * prepared. A statement whose result columns a schema change altered fails
 * once (PostgreSQL: "cached plan must not change result type") and is made
 * again on its next run, as on PostgreSQL.
 *
 * Runs inside PGlite's own locks, as its `query` does (its transaction
 * lock outside a transaction, its query lock always), so a statement of
 * its own never runs between the messages of another. Queries with options
 * this does not handle (parameter types, a blob, a notice callback) go to
 * PGlite's `query` unchanged. Errors are PGlite's DatabaseError, without
 * the statement's text or parameters attached.
 */
export function useNamedStatements(
  client: PGlite,
  { capacity = 256, longest = 16_384 }: { capacity?: number; longest?: number } = {},
): void {
  const prepared = new Map<string, { name: string; types: number[] }>();
  // Texts run once, not yet prepared; forgotten all at once when full.
  const seen = new Set<string>();
  // Statements evicted, closed at the start of the next run.
  const closing: string[] = [];
  let next = 0;
  const { serialize } = protocol;

  async function run<T>(
    text: string,
    params: unknown[],
    options: QueryOptions | undefined,
    inTx: boolean,
  ) {
    let statement = prepared.get(text);
    if (statement) {
      // Most recently used last.
      prepared.delete(text);
      prepared.set(text, statement);
    } else {
      const name = `meshwork_${next++}`;
      const described = await client.execProtocolStream(
        concat([
          serialize.parse({ name, text }),
          serialize.describe({ type: "S", name }),
          serialize.sync(),
        ]),
        { syncToFs: false },
      );
      statement = { name, types: parse.parseDescribeStatementResults(described) };
      prepared.set(text, statement);
      if (prepared.size > capacity) {
        const [oldest] = prepared;
        if (oldest) {
          prepared.delete(oldest[0]);
          closing.push(oldest[1].name);
        }
      }
    }
    const { name, types } = statement;
    const values = params.map((param, i) => {
      if (param === null || param === undefined) return null;
      const oid = types[i] ?? 0;
      const serializer = options?.serializers?.[oid] ?? client.serializers[oid];
      return serializer ? serializer(param) : String(param);
    });
    const messages = [
      ...closing.splice(0).map((old) => serialize.close({ type: "S", name: old })),
      serialize.bind({ statement: name, values }),
      serialize.describe({ type: "P" }),
      serialize.execute({}),
      serialize.sync(),
    ];
    let answer: Awaited<ReturnType<PGlite["execProtocolStream"]>>;
    try {
      answer = await client.execProtocolStream(concat(messages), { syncToFs: !inTx });
    } catch (error) {
      if (isStale(error)) {
        prepared.delete(text);
        closing.push(name);
      }
      throw error;
    }
    return parse.parseResults(answer, client.parsers, options)[0] as Results<T>;
  }

  const usable = (text: unknown, options: QueryOptions | undefined): text is string => {
    if (typeof text !== "string" || text.length > longest) return false;
    if (options?.paramTypes || options?.blob || options?.onNotice) return false;
    if (prepared.has(text)) return true;
    if (seen.has(text)) {
      seen.delete(text);
      return true;
    }
    if (seen.size >= 4 * capacity) seen.clear();
    seen.add(text);
    return false;
  };

  const plainQuery = client.query.bind(client);
  client.query = (async (text: string, params: unknown[] = [], options?: QueryOptions) => {
    if (!usable(text, options)) return plainQuery(text, params, options);
    await client._checkReady();
    return client._runExclusiveTransaction(() =>
      client._runExclusiveQuery(() => run(text, params, options, false)),
    );
  }) as PGlite["query"];

  const plainTransaction = client.transaction.bind(client);
  client.transaction = (<T>(callback: (tx: Transaction) => Promise<T>) =>
    plainTransaction((tx) => {
      const txQuery = tx.query.bind(tx);
      tx.query = (async (text: string, params: unknown[] = [], options?: QueryOptions) => {
        if (tx.closed || !usable(text, options)) return txQuery(text, params, options);
        return client._runExclusiveQuery(() => run(text, params, options, true));
      }) as Transaction["query"];
      return callback(tx);
    })) as PGlite["transaction"];
}

/** Whether a named statement failed because the schema changed under it. */
function isStale(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === "0A000" || code === "26000";
}

function concat(parts: Uint8Array[]): Uint8Array {
  let length = 0;
  for (const p of parts) length += p.length;
  const out = new Uint8Array(length);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
