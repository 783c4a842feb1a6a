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
