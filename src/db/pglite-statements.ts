import {
  type PGlite,
  parse,
  protocol,
  type QueryOptions,
  type Results,
  type Transaction,
  types,
} from "@electric-sql/pglite";
import { type Parsers, readAnswer } from "./pglite-answer.js";
import { wrapPrepareQuery } from "./prepare-hook.js";

/**
 * Named statements on PGlite, for the statements postgres.js prepares on
 * PostgreSQL.
 *
 * PGlite's `query` sends every statement unnamed: each run is parsed,
 * analysed and planned again (a completion's update, with the task row it
 * returns, plans in about 0.8 ms there), in six calls into the database.
 * On PostgreSQL, postgres.js prepares the statements Drizzle is asked to
 * prepare under a name (`.prepare(name)`, and `preparedRowsOf`), and sends
 * the rest unnamed. Here the same statements are prepared: on its first
 * run a named text is prepared (Parse, Describe), and each run is one call
 * (Bind, Describe, Execute, Sync). PostgreSQL's plan cache then treats it
 * as on PostgreSQL: planned afresh for its first five runs, then with a
 * generic plan where that is estimated to cost no more. Every other text
 * runs as the unnamed statement, as PGlite's `query` runs it, and is read
 * here too: in one call where PGlite makes six, or, with parameters, a
 * Parse and Describe for their types, a Sync, then the run (outside a
 * transaction these are two implicit ones; the first only parses).
 *
 * Kept: the last `capacity` statements used (the code has a few dozen). A
 * statement that a schema change made stale (its result columns changed,
 * or it is gone) is prepared again and run once more, as postgres.js does;
 * inside a transaction the failure aborts the transaction, so the caller
 * sees it, and the next run prepares the statement again.
 *
 * Runs inside PGlite's own locks, as its `query` does (its transaction
 * lock outside a transaction, its query lock always), so nothing runs
 * between the messages of one statement. Queries with options this does
 * not handle (parameter types, a blob, a notice callback), and a COPY to
 * PGlite's /dev/blob (whose bytes PGlite attaches to its own result), go
 * to PGlite's `query`. Errors are PGlite's DatabaseError, without the
 * statement's text or parameters attached.
 *
 * The answer's messages are read here (pglite-answer.ts), not by PGlite,
 * which copies every value of every row before decoding it, and whose
 * decoder drops a U+FEFF (byte order mark) at the start of a text value:
 * a task named "\uFEFFx" read back as "x" from a list and as itself from
 * a read by id; here a text reads back as stored, as on PostgreSQL. The
 * NOTIFYs that such an answer delivers are handed on here too, to the
 * listeners registered through PGlite's `listen` and `onNotification`,
 * which this keeps a list of beside PGlite's own.
 */
export function useNamedStatements(client: PGlite, { capacity = 256 } = {}): void {
  if (patched.has(client)) return;
  patched.add(client);
  const prepared = new Map<string, { name: string; types: number[] }>();
  // Statements evicted or stale, closed at the start of the next run.
  const closing: string[] = [];
  let next = 0;
  const { serialize } = protocol;

  // Each type's parser: a query's own over the client's over PGlite's
  // defaults, as PGlite's parseResults has them (the client's read when
  // the answer comes, as there). Looked up per column of an answer:
  // Drizzle passes new parsers with each query it prepares (preparedRowsOf
  // prepares one per call), so merging them per run, as PGlite does, would
  // copy every parser each time.
  const parsersFor =
    (options: QueryOptions | undefined) =>
    (typeId: number): Parsers[number] =>
      (options?.parsers as Parsers | undefined)?.[typeId] ??
      (client.parsers as Parsers)[typeId] ??
      (types.parsers as Parsers)[typeId];

  // The listeners of each channel and of every channel, for the NOTIFYs
  // that an answer read here delivers: PGlite hands on only those its own
  // reading sees. Kept as PGlite keeps its own (through its listen,
  // unlisten, onNotification and offNotification), and called as it calls
  // them, each in a microtask.
  const listeners = new Map<string, Set<(payload: string) => void>>();
  const everyChannel = new Set<(channel: string, payload: string) => void>();
  const notify = (channel: string, payload: string) => {
    for (const listener of listeners.get(channel) ?? []) queueMicrotask(() => listener(payload));
    for (const listener of everyChannel) queueMicrotask(() => listener(channel, payload));
  };
  const plainListen = client.listen.bind(client);
  client.listen = (async (
    channel: string,
    callback: (payload: string) => void,
    tx?: Transaction,
  ) => {
    // Listening before LISTEN runs, as PGlite does: a statement may run
    // meanwhile, and its NOTIFY would be lost.
    const name = postgresName(channel);
    const set = listeners.get(name) ?? new Set();
    listeners.set(name, set.add(callback));
    try {
      const unlisten = await plainListen(channel, callback, tx);
      return async (tx?: Transaction) => {
        set.delete(callback);
        await unlisten(tx);
      };
    } catch (error) {
      set.delete(callback);
      throw error;
    }
  }) as PGlite["listen"];
  const plainUnlisten = client.unlisten.bind(client);
  client.unlisten = (async (
    channel: string,
    callback?: (payload: string) => void,
    tx?: Transaction,
  ) => {
    // Without a callback PGlite runs UNLISTEN and keeps the channel's
    // callbacks (a later LISTEN brings them back): so does this.
    if (callback) listeners.get(postgresName(channel))?.delete(callback);
    await plainUnlisten(channel, callback, tx);
  }) as PGlite["unlisten"];
  const plainOn = client.onNotification.bind(client);
  client.onNotification = (callback: (channel: string, payload: string) => void) => {
    everyChannel.add(callback);
    const off = plainOn(callback);
    return () => {
      everyChannel.delete(callback);
      off();
    };
  };
  const plainOff = client.offNotification.bind(client);
  client.offNotification = (callback: (channel: string, payload: string) => void) => {
    everyChannel.delete(callback);
    plainOff(callback);
  };

  async function statementFor(text: string) {
    const known = prepared.get(text);
    if (known) {
      // Most recently used last.
      prepared.delete(text);
      prepared.set(text, known);
      return known;
    }
    const name = `meshwork_${next++}`;
    const statement = { name, types: await parseAndDescribe(name, text) };
    prepared.set(text, statement);
    if (prepared.size > capacity) {
      const [oldest] = prepared;
      if (oldest) {
        prepared.delete(oldest[0]);
        closing.push(oldest[1].name);
      }
    }
    return statement;
  }

  /** Parses `text` as the statement `name` ("": the unnamed one); its parameters' types. */
  async function parseAndDescribe(name: string, text: string): Promise<number[]> {
    const described = await client.execProtocolStream(
      Buffer.concat([
        serialize.parse({ name, text }),
        serialize.describe({ type: "S", name }),
        serialize.sync(),
      ]),
      { syncToFs: false },
    );
    return parse.parseDescribeStatementResults(described);
  }

  /**
   * A text the code builds per call, run as the unnamed statement, as
   * PGlite's `query` runs every text: parsed (and described, for its
   * parameters' types) at each run. Without parameters the Parse goes with
   * the run, in the same call (`lead`).
   */
  async function unnamedFor(text: string, withParams: boolean) {
    if (!withParams) return { name: "", types: [], lead: [serialize.parse({ text })] };
    return { name: "", types: await parseAndDescribe("", text), lead: [] };
  }

  async function execute<T>(
    text: string,
    params: unknown[],
    options: QueryOptions | undefined,
    inTx: boolean,
  ): Promise<Results<T>> {
    const named = namedTexts.has(text);
    const { name, types, lead } = named
      ? { ...(await statementFor(text)), lead: [] }
      : await unnamedFor(text, params.length > 0);
    const values = params.map((param, i) => {
      if (param === null || param === undefined) return null;
      const oid = types[i] ?? 0;
      const serializer = options?.serializers?.[oid] ?? client.serializers[oid];
      return serializer ? serializer(param) : String(param);
    });
    const messages = [
      ...closing.splice(0).map((old) => serialize.close({ type: "S", name: old })),
      ...lead,
      serialize.bind({ statement: name, values }),
      serialize.describe({ type: "P" }),
      serialize.execute({}),
      serialize.sync(),
    ];
    try {
      // The answer's bytes as they are: PGlite's own reading of them took
      // about 15 % of the coordinator's time in a drain here.
      const chunks: Buffer[] = [];
      await client.execProtocolRawStream(Buffer.concat(messages), {
        syncToFs: !inTx,
        // A view of the database's memory, reused by its next output: copied.
        onRawData: (data) => void chunks.push(Buffer.from(data)),
      });
      const bytes = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks);
      const answer = readAnswer<T>(bytes, parsersFor(options), options?.rowMode);
      for (const n of answer.notifications) notify(n.channel, n.payload);
      if (answer.failed) throw answer.error;
      return answer.results;
    } catch (error) {
      if (named && isStale(error)) {
        prepared.delete(text);
        closing.push(name);
      }
      throw error;
    }
  }

  async function run<T>(
    text: string,
    params: unknown[],
    options: QueryOptions | undefined,
    inTx: boolean,
  ): Promise<Results<T>> {
    try {
      return await execute<T>(text, params, options, inTx);
    } catch (error) {
      if (inTx || !isStale(error)) throw error;
      return execute<T>(text, params, options, inTx);
    }
  }

  const usable = (text: unknown, options: QueryOptions | undefined): text is string =>
    typeof text === "string" &&
    !options?.paramTypes &&
    !options?.blob &&
    !options?.onNotice &&
    !text.includes("/dev/blob");

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

/** A channel's name as PostgreSQL has it: unquoted, folded to lower case (as PGlite's listen). */
function postgresName(channel: string): string {
  return channel.startsWith('"') && channel.endsWith('"')
    ? channel.slice(1, -1)
    : channel.toLowerCase();
}

const patched = new WeakSet<PGlite>();
const recorded = Symbol("meshwork.recordNamedStatements");

/**
 * The texts Drizzle was asked to prepare under a name: the code's own, a
 * few dozen (preparedRowsOf is not for a text built per call). Bounded all
 * the same: past 1,000, no more are prepared.
 */
const namedTexts = new Set<string>();

/** Prepares `text` on PGlite as postgres.js prepares it on PostgreSQL (useNamedStatements). */
export function nameStatement(text: string): void {
  if (namedTexts.size < 1000) namedTexts.add(text);
}

/**
 * Has Drizzle's PGlite session (its class, from drizzle-orm/pglite) record
 * the text of each statement it is asked to prepare under a name, the
 * sessions of transactions included. Drizzle's PGlite driver itself
 * ignores the name. Once per process.
 */
export function recordNamedStatements(session: { prototype: object }): void {
  wrapPrepareQuery(
    session,
    recorded,
    (prepareQuery) =>
      function (this: unknown, query, fields, name, ...rest) {
        if (typeof name === "string" && name !== "") nameStatement(query.sql);
        return prepareQuery.call(this, query, fields, name, ...rest);
      },
  );
}

/**
 * Whether a named statement failed because a schema change made it stale:
 * the errors postgres.js runs a prepared statement again after (by the
 * PostgreSQL routine that raised them).
 */
function isStale(error: unknown): boolean {
  const routine = (error as { routine?: unknown } | null)?.routine;
  return routine === "RevalidateCachedQuery" || routine === "FetchPreparedStatement";
}
