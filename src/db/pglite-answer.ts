import { protocol, type Results } from "@electric-sql/pglite";

/** A text value's parser, by type oid, as PGlite keeps them (`client.parsers`). */
export type Parsers = Record<number, ((text: string, typeId: number) => unknown) | undefined>;

/** What the backend answered to one statement's run, up to its Sync (pglite-statements.ts). */
export interface Answer<T> {
  /** The statement's result, as PGlite's `parseResults` gives its first. */
  results: Results<T>;
  /**
   * The first error the backend reported (PGlite's DatabaseError), else the
   * first a value's parser threw, if any (`failed`).
   */
  error: unknown;
  failed: boolean;
  /** NOTIFYs delivered with the answer (a statement that committed one). */
  notifications: { channel: string; payload: string }[];
}

/**
 * Reads the backend messages of one statement's answer, as PGlite's own
 * parser and `parseResults` do, for the messages an extended-protocol run
 * gives: RowDescription, DataRow, CommandComplete, ErrorResponse (read by
 * PGlite's parser, so the error is the one its `query` throws) and
 * NotificationResponse; the rest (ParseComplete, BindComplete, NoData,
 * EmptyQueryResponse, ReadyForQuery, notices) carry nothing a result
 * needs. A value is decoded straight from the answer's bytes; PGlite
 * copies each into a buffer of its own first.
 *
 * `parserOf` gives the parser of a type oid (the query's own over the
 * client's over PGlite's defaults); a type without one stays text, as there.
 */
export function readAnswer<T>(
  answer: Buffer,
  parserOf: (typeId: number) => Parsers[number],
  rowMode: "array" | "object" = "object",
): Answer<T> {
  let fields: { name: string; dataTypeID: number }[] = [];
  let decode: Parsers[number][] = [];
  let rows: unknown[] = [];
  let results: Results<T> | undefined;
  let error: Error | undefined;
  // A value its type's parser threw on (the error a database error comes before).
  let unreadable: { error: unknown } | undefined;
  let affectedRows = 0;
  const notifications: Answer<T>["notifications"] = [];
  for (let at = 0; at + 5 <= answer.length; ) {
    const type = answer[at];
    const end = at + 1 + answer.readInt32BE(at + 1);
    let p = at + 5;
    switch (type) {
      case 0x54: {
        // RowDescription: per field its name, table oid (4), column (2),
        // type oid (4), size (2), modifier (4) and format (2).
        const count = answer.readInt16BE(p);
        p += 2;
        fields = [];
        decode = [];
        rows = [];
        for (let i = 0; i < count; i++) {
          const zero = answer.indexOf(0, p);
          const name = answer.toString("utf8", p, zero);
          const dataTypeID = answer.readInt32BE(zero + 7);
          p = zero + 19;
          fields.push({ name, dataTypeID });
          decode.push(parserOf(dataTypeID));
        }
        break;
      }
      case 0x44: {
        // DataRow: per value its length (-1 for NULL) and its text.
        const count = answer.readInt16BE(p);
        p += 2;
        const values: unknown[] = new Array(count);
        for (let i = 0; i < count; i++) {
          const length = answer.readInt32BE(p);
          p += 4;
          if (length < 0) {
            values[i] = null;
            continue;
          }
          const text = answer.toString("utf8", p, p + length);
          p += length;
          const parser = decode[i];
          try {
            values[i] = parser ? parser(text, fields[i]?.dataTypeID ?? 0) : text;
          } catch (failure) {
            // The statement fails with it, as PGlite's reading fails it,
            // once the rest is read: the NOTIFYs of a statement that
            // committed are still handed on.
            unreadable ??= { error: failure };
            values[i] = text;
          }
        }
        if (rowMode === "array") rows.push(values);
        else {
          const row: Record<string, unknown> = {};
          for (let i = 0; i < count; i++) {
            const name = (fields[i] as { name: string }).name;
            // A column named __proto__ is a key of its own, as Object.fromEntries makes it.
            if (name === "__proto__")
              Object.defineProperty(row, name, {
                value: values[i],
                enumerable: true,
                writable: true,
                configurable: true,
              });
            else row[name] = values[i];
          }
          rows.push(row);
        }
        break;
      }
      case 0x43: {
        // CommandComplete: its tag ("UPDATE 3", "INSERT 0 5", "SELECT 2").
        const tag = answer.toString("utf8", p, answer.indexOf(0, p));
        const words = tag.split(" ");
        const command = words[0] ?? "";
        const rowCount = Number.parseInt(words[words.length - 1] ?? "", 10);
        if (["INSERT", "UPDATE", "DELETE", "COPY", "MERGE"].includes(command))
          affectedRows += rowCount;
        results ??= {
          rows: rows as T[],
          fields,
          command,
          affectedRows,
          ...(!Number.isNaN(rowCount) && { rowCount }),
        } as Results<T>;
        rows = [];
        fields = [];
        break;
      }
      case 0x45:
        // ErrorResponse: the first one is the error, as PGlite's `query` has it.
        error ??= databaseError(answer.subarray(at, end));
        break;
      case 0x41: {
        // NotificationResponse: the sender's pid (4), the channel, the
        // payload. PGlite hands on none after an error: nor does this.
        if (error) break;
        const channelEnd = answer.indexOf(0, p + 4);
        const channel = answer.toString("utf8", p + 4, channelEnd);
        const payload = answer.toString("utf8", channelEnd + 1, answer.indexOf(0, channelEnd + 1));
        notifications.push({ channel, payload });
        break;
      }
    }
    at = end;
  }
  return {
    results: results ?? ({ affectedRows: 0, rows: [], fields: [] } as Results<T>),
    failed: error !== undefined || unreadable !== undefined,
    error: error ?? unreadable?.error,
    notifications,
  };
}

/** An ErrorResponse message as PGlite's parser reads it: its DatabaseError. */
function databaseError(message: Buffer): Error {
  let found: Error | undefined;
  new protocol.Parser().parse(message, (m) => {
    if (m instanceof Error) found = m;
  });
  return found ?? new Error("the embedded database reported an error it did not describe");
}
