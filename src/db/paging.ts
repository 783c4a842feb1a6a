import { and, type Column, eq, gt, lt, or, type SQL } from "drizzle-orm";
import { StoreError } from "./errors.js";

/** Position after the last row of a page, for keyset paging on (time, id). */
export interface Cursor {
  at: Date;
  id: string;
}

export function encodeCursor(c: Cursor): string {
  return Buffer.from(JSON.stringify([c.at.getTime(), c.id])).toString("base64url");
}

/** Decodes a page token; an empty token is the first page. */
export function decodeCursor(token: string): Cursor | undefined {
  if (token === "") return undefined;
  try {
    const [ms, id] = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as unknown[];
    if (typeof ms === "number" && typeof id === "string" && isUuid(id)) {
      return { at: new Date(ms), id };
    }
  } catch {
    // fall through
  }
  throw new StoreError(
    "invalid_argument",
    "INVALID_PAGE_TOKEN",
    "page_token is not a token this server issued",
  );
}

/** 1–1000; 0 means the default 100. */
export function pageSize(requested: number): number {
  if (requested === 0) return 100;
  if (!Number.isInteger(requested) || requested < 1 || requested > 1000) {
    throw new StoreError(
      "invalid_argument",
      "INVALID_ARGUMENT",
      "page_size must be from 1 to 1000",
    );
  }
  return requested;
}

const uuidPattern = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function isUuid(s: string): boolean {
  return uuidPattern.test(s);
}

/** Rows strictly after `c` in (at, id) order, ascending or descending; undefined on the first page. */
export function keysetAfter(
  at: Column,
  id: Column,
  c: Cursor | undefined,
  order: "asc" | "desc",
): SQL | undefined {
  if (!c) return undefined;
  const beyond = order === "asc" ? gt : lt;
  return or(beyond(at, c.at), and(eq(at, c.at), beyond(id, c.id)));
}

/** The page of a query that fetched `size + 1` rows, and the next page's token ("" at the end). */
export function pageOf<T>(
  rows: T[],
  size: number,
  cursorOf: (row: T) => Cursor,
): { rows: T[]; next: string } {
  const page = rows.slice(0, size);
  const last = page[page.length - 1];
  return { rows: page, next: rows.length > size && last ? encodeCursor(cursorOf(last)) : "" };
}
