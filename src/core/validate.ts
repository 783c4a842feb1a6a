import { invalid } from "./errors.js";

/**
 * Field validators shared by every service: each returns the checked value
 * or throws `invalid_argument` naming the field. `field` is the name a
 * client sent (snake_case), with a prefix such as `tasks[3].` in batches.
 */

/** Identifiers, names, keys: at most this many characters. */
export const maxText = 256;

/** A UTF-16 surrogate without its pair: a string that has no UTF-8 form. */
const loneSurrogate = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * Checks an identifier-like string: non-empty unless `optional`, at most
 * 256 characters, text with a UTF-8 form (a lone surrogate, which Connect
 * JSON's `\ud800` can carry, has none: PostgreSQL's jsonb refuses it).
 */
export function text(field: string, value: string, { optional = false } = {}): string {
  if (!optional && value.trim() === "") throw invalid(`${field} is required`);
  if (value.length > maxText) throw invalid(`${field} is longer than ${maxText} characters`);
  if (loneSurrogate.test(value)) throw invalid(`${field} is not valid Unicode text`);
  return value;
}

/** Checks a whole number within [min, max]. */
export function intInRange(field: string, value: number, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw invalid(`${field} must be from ${min} to ${max}, not ${value}`);
  }
  return value;
}

/** Checks a list of identifier-like strings (at most `maxItems`); duplicates are dropped. */
export function stringList(field: string, values: string[], maxItems = 100): string[] {
  if (values.length > maxItems) throw invalid(`${field} has more than ${maxItems} entries`);
  for (const v of values) text(`${field} entry`, v);
  return [...new Set(values)];
}

/** Checks a string map: keys required, values may be empty, both at most 256 characters. */
export function stringMap(
  field: string,
  map: Record<string, string>,
  maxItems = 100,
): Record<string, string> {
  const entries = Object.entries(map);
  if (entries.length > maxItems) throw invalid(`${field} has more than ${maxItems} entries`);
  for (const [k, v] of entries) {
    text(`${field} key`, k);
    text(`${field}[${k}]`, v, { optional: true });
  }
  return map;
}

const uuidPattern = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function isUuid(s: string): boolean {
  return uuidPattern.test(s);
}

/** Checks a required id: a UUID (returned lower-cased), else `invalid_argument`. */
export function uuidField(field: string, value: string): string {
  if (value === "") throw invalid(`${field} is required`);
  if (!isUuid(value)) {
    throw invalid(`${field} must be a UUID, not ${JSON.stringify(value.slice(0, 64))}`);
  }
  return value.toLowerCase();
}

/** Attempts are counted from 1 (0 means "never leased" and names no lease). */
export function attemptField(field: string, value: number): number {
  return intInRange(field, value, 1, 2_000_000_000);
}

/**
 * The times a protobuf Timestamp may hold, 0001-01-01 to 9999-12-31 UTC. A
 * Date outside them (or invalid) cannot be sent to PostgreSQL: a year past
 * 9999 is written "+010000-…", which it does not parse.
 */
const earliestMs = -62_135_596_800_000;
const latestMs = 253_402_300_799_999;

/** A valid Date from 0001-01-01 to 9999-12-31 UTC. */
export function isStorableTime(d: Date): boolean {
  const ms = d.getTime();
  return ms >= earliestMs && ms <= latestMs;
}

/** Checks a time a client sent (a Timestamp field): storable, else `invalid_argument`. */
export function timeField(field: string, d: Date): Date {
  if (!isStorableTime(d)) throw invalid(`${field} must be a time from 0001-01-01 to 9999-12-31`);
  return d;
}

/** Why a request string cannot be stored: it holds U+0000, or a lone surrogate. */
export type UnstorableText = "nul" | "surrogate";

declare global {
  interface String {
    /**
     * False for a string holding a lone surrogate. ES2024: Node 20 has it,
     * the ES2023 lib this builds against does not declare it.
     */
    isWellFormed(): boolean;
  }
}

function unstorable(s: string): UnstorableText | undefined {
  if (s.includes("\u0000")) return "nul";
  return s.isWellFormed() ? undefined : "surrogate";
}

/**
 * Where a request message holds a string PostgreSQL cannot take (a field,
 * element, map key or JSON value), as a path such as `entries[2].value.a`,
 * and why: U+0000, which text cannot store or compare, or a lone UTF-16
 * surrogate, which has no UTF-8 form (Connect JSON's `"\ud800"` carries
 * one; binary protobuf cannot). Undefined when none does. A request
 * carrying one is refused before any statement sees it. Bytes fields
 * (Uint8Array) are not strings and may hold anything. Iterative, so that
 * deeply nested JSON cannot exhaust the stack.
 *
 * Every request passes through here, most with nothing wrong: the walk
 * looks first without naming where (a CreateTasks of 1,000 tasks would
 * otherwise build a path string for each of its 21,000 fields or more),
 * and walks again with paths only when it found one.
 */
export function unstorableText(
  message: unknown,
): { path: string; why: UnstorableText } | undefined {
  return holdsUnstorable(message) ? unstorableWalk(message) : undefined;
}

/**
 * Refuses `message` with `invalid_argument`, naming where, when it holds a
 * string PostgreSQL cannot take (unstorableText).
 */
export function refuseUnstorableText(message: unknown): void {
  const found = unstorableText(message);
  if (found === undefined) return;
  throw invalid(
    found.why === "nul"
      ? `${found.path} must not contain U+0000 (NUL)`
      : `${found.path} is not valid Unicode text (it holds a lone surrogate)`,
  );
}

/** Whether any string or key in `message` is one PostgreSQL cannot take. */
function holdsUnstorable(message: unknown): boolean {
  const stack: unknown[] = [message];
  while (stack.length > 0) {
    const value = stack.pop();
    if (typeof value === "string") {
      if (unstorable(value)) return true;
    } else if (typeof value !== "object" || value === null || value instanceof Uint8Array) {
      // numbers, booleans, bigints, bytes
    } else if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) stack.push(value[i]);
    } else {
      const record = value as Record<string, unknown>;
      for (const k of Object.keys(record)) {
        if (unstorable(k)) return true;
        stack.push(record[k]);
      }
    }
  }
  return false;
}

/** A key a path may name bare: `a.b_c`; any other is quoted, as `["a.b"]`. */
const plainKey = /^[A-Za-z_][A-Za-z0-9_]{0,63}$/;

/**
 * Key `k` as a step of a path: `.k`, or `["k"]` in JSON's quoting (a lone
 * surrogate as `\ud800`, so the message itself stays valid text), cut to
 * 64 characters: a message never repeats a long key whole.
 */
function member(k: string): string {
  if (plainKey.test(k)) return `.${k}`;
  if (k.length <= 64) return `[${JSON.stringify(k)}]`;
  return `[${JSON.stringify(k.slice(0, 64))}…]`;
}

function unstorableWalk(message: unknown): { path: string; why: UnstorableText } | undefined {
  const stack: [unknown, string][] = [[message, ""]];
  for (let next = stack.pop(); next; next = stack.pop()) {
    const [value, path] = next;
    if (typeof value === "string") {
      const why = unstorable(value);
      if (why) return { path: path || "(message)", why };
    } else if (Array.isArray(value)) {
      value.forEach((v, i) => {
        stack.push([v, `${path}[${i}]`]);
      });
    } else if (value !== null && typeof value === "object" && !(value instanceof Uint8Array)) {
      for (const [k, v] of Object.entries(value)) {
        const at = path ? `${path}${member(k)}` : plainKey.test(k) ? k : member(k);
        const why = unstorable(k);
        if (why) return { path: at, why };
        stack.push([v, at]);
      }
    }
  }
  return undefined;
}

/**
 * The deepest a JSON value (a task's parameters, a knowledge entry's value)
 * may nest. In protobuf every level is two messages (Struct, then Value),
 * and protobuf's usual limit on nested messages is 100 (protobuf-es, C++,
 * Python, Java): a value of 48 levels, inside its Task and its response, is
 * the deepest that every client reads back with its library's defaults,
 * whatever its protocol. Every protocol and both REST contracts are held to
 * it, and refuse a deeper value by its field's name.
 */
export const maxJsonDepth = 48;

/**
 * How deep `value` nests (a scalar: 0; `{}` or `[]`: 1), counted without
 * recursion, and whether it holds a number JSON cannot carry (NaN or an
 * infinity: a protobuf Struct in binary can).
 */
function jsonShape(value: unknown): { depth: number; nonFinite: boolean } {
  let deepest = 0;
  let nonFinite = false;
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop() as [unknown, number];
    if (typeof v === "number" && !Number.isFinite(v)) nonFinite = true;
    if (v === null || typeof v !== "object") continue;
    const here = depth + 1;
    if (here > deepest) deepest = here;
    if (deepest > maxJsonDepth + 1) break;
    for (const child of Array.isArray(v) ? v : Object.values(v)) stack.push([child, here]);
  }
  return { depth: deepest, nonFinite };
}

/**
 * Refuses a JSON value nested deeper than maxJsonDepth, or holding NaN or
 * an infinity (stored as JSON, it would become null: the value read back
 * would not be the one sent), naming the field.
 */
export function shallowJson<T>(field: string, value: T): T {
  const shape = jsonShape(value);
  if (shape.depth > maxJsonDepth) {
    throw invalid(`${field} is nested deeper than ${maxJsonDepth} levels`);
  }
  if (shape.nonFinite) {
    throw invalid(`${field} holds NaN or an infinity, which JSON cannot carry`);
  }
  return value;
}
