import { type Column, type SQL, sql } from "drizzle-orm";
import { DomainError, invalid } from "./errors.js";
import { isStorableTime, isUuid } from "./validate.js";

/**
 * Keyset paging. A page token is the position of the last row of a page:
 * its time and the keys that order rows sharing that time, as base64url
 * JSON. One codec for every listing (tasks, workers, artifacts, knowledge).
 */
export interface Position {
  at: Date;
  keys: string[];
}

export function encodePageToken(p: Position): string {
  return Buffer.from(JSON.stringify([p.at.getTime(), ...p.keys])).toString("base64url");
}

/**
 * Decodes a page token of `keyCount` keys, each accepted by `validKey`; an
 * empty token is the first page. Anything else is `invalid_argument`, as is
 * a time outside 0001–9999 or a key with U+0000: both go into a statement,
 * which would fail on them.
 */
export function decodePageToken(
  token: string,
  keyCount: number,
  validKey: (key: string) => boolean = () => true,
): Position | undefined {
  if (token === "") return undefined;
  try {
    const [ms, ...keys] = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as unknown[];
    if (
      typeof ms === "number" &&
      isStorableTime(new Date(ms)) &&
      keys.length === keyCount &&
      keys.every((k): k is string => typeof k === "string" && !k.includes("\u0000") && validKey(k))
    ) {
      return { at: new Date(ms), keys };
    }
  } catch {
    // fall through
  }
  throw new DomainError(
    "invalid_argument",
    "INVALID_PAGE_TOKEN",
    "page_token is not a token this server issued",
  );
}

/** Decodes the page token of a listing ordered by (time, id): tasks, workers, artifacts. */
export function decodeCursor(token: string): Position | undefined {
  return decodePageToken(token, 1, isUuid);
}

/** 1–1000; 0 means the default 100. */
export function pageSize(requested: number): number {
  if (requested === 0) return 100;
  if (!Number.isInteger(requested) || requested < 1 || requested > 1000) {
    throw invalid("page_size must be from 1 to 1000");
  }
  return requested;
}

/**
 * Rows strictly after `position` in the order of `columns` (a time column,
 * then key columns), ascending or descending: one row comparison, which a
 * btree index on the same columns serves. Undefined on the first page.
 */
export function keysetAfter(
  columns: [Column, ...Column[]],
  position: Position | undefined,
  order: "asc" | "desc",
): SQL | undefined {
  if (!position) return undefined;
  const values = [position.at, ...position.keys].map((v, i) => sql.param(v, columns[i]));
  const row = (items: SQL.Aliased[] | unknown[]) => sql`(${sql.join(items as SQL[], sql`, `)})`;
  return sql`${row(columns)} ${sql.raw(order === "asc" ? ">" : "<")} ${row(values)}`;
}

/** The page of a query that fetched `size + 1` rows, and the next page's token ("" at the end). */
export function pageOf<T>(
  rows: T[],
  size: number,
  positionOf: (row: T) => Position,
): { rows: T[]; next: string } {
  const page = rows.slice(0, size);
  const last = page[page.length - 1];
  return { rows: page, next: rows.length > size && last ? encodePageToken(positionOf(last)) : "" };
}

/** Position of a row ordered by (time, id). */
export function byTimeAndId(at: Date, id: string): Position {
  return { at, keys: [id] };
}

/**
 * Position of a row of a listing ordered by a text key alone (limits,
 * rates, the share tree): the same codec, at time 0.
 */
export function byKey(key: string): Position {
  return { at: new Date(0), keys: [key] };
}

/** Decodes the page token of a listing ordered by a text key: the last key of the page before. */
export function decodeKeyCursor(token: string): string | undefined {
  return decodePageToken(token, 1)?.keys[0];
}
