import { Column, is, SQL, Subquery } from "drizzle-orm";
import { wrapPrepareQuery } from "./prepare-hook.js";

/** A selected field as Drizzle hands it to a session's prepareQuery: where it goes, and what it is. */
interface SelectedField {
  path: string[];
  field: unknown;
}

interface Decoder {
  mapFromDriverValue(value: unknown): unknown;
}

type RowMapper = (rows: unknown[][]) => Record<string, unknown>[];

const compiled = Symbol("meshwork.compiledRowMapping");

/**
 * Has a Drizzle session class (PostgresJsSession, PgliteSession) map the
 * rows of a flat selection (every field a top-level key: what every store
 * here selects and returns) with a mapper made once per prepared query,
 * instead of Drizzle's `mapResultRow` per row. That one works out each
 * column's decoder again on every row (up to three `is` checks, each a
 * walk up the class chain), walks each field's path and reduces into the
 * row: in a batched drain it was 8 % of the coordinator's CPU on
 * PostgreSQL, for the 61 columns of each task a completion answers.
 *
 * The mapper is what Drizzle's own session takes as `customResultMapper`
 * (its relational queries pass theirs, which are left as they are), and
 * it decodes as `mapResultRow` does: NULL stays null, every other value
 * goes through the same decoder. A nested selection (a field under an
 * object, or a join's table) keeps Drizzle's mapping, which also nulls a
 * left-joined table's object. Once per class.
 */
export function compileRowMapping(session: { prototype: object }): void {
  wrapPrepareQuery(
    session,
    compiled,
    (prepareQuery) =>
      function (this: unknown, query, fields, name, arrayMode, mapper, ...rest) {
        const flat =
          mapper === undefined ? flatRowMapper(fields as SelectedField[] | undefined) : undefined;
        return prepareQuery.call(this, query, fields, name, arrayMode, flat ?? mapper, ...rest);
      },
  );
}

/** The mapper of a flat selection's rows, or undefined for any other (Drizzle's own then). */
function flatRowMapper(fields: SelectedField[] | undefined): RowMapper | undefined {
  if (!fields || fields.length === 0) return undefined;
  const keys: string[] = [];
  const decoders: Decoder[] = [];
  for (const { path, field } of fields) {
    const [key] = path;
    if (path.length !== 1 || key === undefined) return undefined;
    const decoder = decoderOf(field);
    if (!decoder) return undefined;
    keys.push(key);
    decoders.push(decoder);
  }
  const count = keys.length;
  return (rows) =>
    rows.map((row) => {
      const out: Record<string, unknown> = {};
      for (let i = 0; i < count; i++) {
        const value = row[i];
        out[keys[i] as string] =
          value === null ? null : (decoders[i] as Decoder).mapFromDriverValue(value);
      }
      return out;
    });
}

/** A field's decoder, chosen as Drizzle's mapResultRow chooses it. */
function decoderOf(field: unknown): Decoder | undefined {
  if (is(field, Column)) return field as unknown as Decoder;
  if (is(field, SQL)) return decoderOfSql(field);
  if (is(field, Subquery)) return decoderOfSql((field as unknown as { _: { sql: SQL } })._.sql);
  const aliased = (field as { sql?: unknown } | null)?.sql;
  if (is(aliased, SQL)) return decoderOfSql(aliased);
  return undefined;
}

/** An SQL fragment's decoder (`.mapWith()`; internal to Drizzle's types). */
const decoderOfSql = (s: SQL): Decoder => (s as unknown as { decoder: Decoder }).decoder;
