import type { SQL, Subquery } from "drizzle-orm";
import { PgDialect } from "drizzle-orm/pg-core";
import type { Db } from "./database.js";

/**
 * Driver differences, kept here so that stores never see them. For a
 * computed column Drizzle leaves the value as the driver gives it: a boolean
 * may come as `true` or as PostgreSQL's text form `"t"`, a count as a number
 * or a string, and a raw statement's rows as an array (postgres.js) or as
 * `{ rows }` (PGlite).
 */

/** A boolean from either driver (`.mapWith(asBoolean)` on a computed column). */
export function asBoolean(value: unknown): boolean {
  return value === true || value === "t";
}

/**
 * A number from either driver: a count or sum may come as a number or as
 * a string (bigint and numeric are text to postgres.js); a missing value
 * (no row) is 0.
 */
export function asNumber(value: unknown): number {
  return value === null || value === undefined ? 0 : Number(value);
}

/** Runs a raw statement and returns its rows, whichever driver ran it. */
export async function rowsOf<T>(db: Pick<Db, "execute">, query: SQL): Promise<T[]> {
  return rowsFrom<T>(await db.execute(query));
}

function rowsFrom<T>(result: unknown): T[] {
  if (Array.isArray(result)) return result as T[];
  return ((result as { rows?: T[] }).rows ?? []) as T[];
}

const dialect = new PgDialect();

/**
 * `rowsOf` for a raw statement whose text never varies (its values are all
 * parameters), run as a prepared statement, as Drizzle's `.prepare(name)`
 * runs those it builds. `db.execute` sends a raw statement unnamed, and
 * postgres.js then parses it and asks for its parameters' types in a round
 * trip of its own before every run: two round trips, and the text parsed
 * and planned each time (a serial CreateTask: about 1 ms of its 6 here).
 * Prepared, it is parsed once per connection and runs in one round trip.
 * Not for a text built per call: postgres.js keeps every statement it
 * prepared for as long as its connection lives. (PGlite runs in process:
 * no round trip to save, and the same call works there.)
 *
 * Goes through the session as `db.execute` itself does (dialect.sqlToQuery,
 * session.prepareQuery: Drizzle's own API, to check on its upgrades), with a
 * name, which is what makes postgres.js prepare it. The name is only that
 * flag: postgres.js names the statements it prepares itself. A prepared
 * statement should name the columns it returns: one whose result type
 * follows the table (`RETURNING *`) fails once on each connection after a
 * column is added (tasks/insert.ts).
 */
export async function preparedRowsOf<T>(db: Pick<Db, "_">, name: string, query: SQL): Promise<T[]> {
  const prepared = db._.session.prepareQuery(dialect.sqlToQuery(query), undefined, name, false);
  return rowsFrom<T>(await prepared.execute());
}

/**
 * A raw subquery whose columns are exactly a table's (a function returning
 * `SETOF tasks`, say), typed as that table, so that Drizzle maps its rows
 * as it maps a select from the table. Drizzle's types have no such case.
 */
export function asTable<T>(subquery: Subquery, _table: T): T {
  return subquery as unknown as T;
}
