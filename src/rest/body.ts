import { Operator } from "../../gen/meshwork/v1/task_pb.js";
import { DomainError, invalid } from "../core/errors.js";
import { refuseUnstorableText, shallowJson } from "../core/validate.js";

/** A JSON object as a REST client sent it. */
export type JsonBody = Record<string, unknown>;

/**
 * Reads a request's JSON object body, at most `maxBytes` (the RPC message
 * limit, `resource_exhausted` beyond it). An empty body is `{}` when
 * `optional` (the director's schedule and retry take an optional body).
 * Anything but a JSON object is `invalid_argument`; so is a field not in
 * `known`: a misspelt field is an error, never silently dropped.
 */
export async function readJson(
  source: AsyncIterable<Uint8Array>,
  maxBytes: number,
  known: readonly string[] | "any",
  { optional = false } = {},
): Promise<JsonBody> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of source) {
    size += chunk.byteLength;
    if (size > maxBytes) {
      // The rest of the body is dropped once the refusal is sent (http/body-guard.ts, closeUnread).
      throw new DomainError(
        "resource_exhausted",
        "MESSAGE_TOO_LARGE",
        `the body is larger than ${maxBytes} bytes`,
      );
    }
    chunks.push(chunk);
  }
  const text = Buffer.concat(chunks).toString("utf8");
  if (text.trim() === "") {
    if (optional) return {};
    throw invalid("the body must be a JSON object");
  }
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw invalid("the body is not valid JSON");
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw invalid("the body must be a JSON object");
  }
  for (const [key, value] of Object.entries(body)) {
    // Before anything converts it (a Struct, then protobuf): every field's
    // value nests at most as deep as an RPC accepts, and a deeper one is
    // refused by name, whatever its depth.
    shallowJson(JSON.stringify(key.slice(0, 64)), value);
    if (known !== "any" && !known.includes(key)) {
      throw invalid(
        `unknown field ${JSON.stringify(key.slice(0, 64))}; known: ${known.join(", ")}`,
      );
    }
  }
  // As the RPCs refuse it, and before the in-process call: its binary
  // encoding would turn a lone surrogate into U+FFFD and store that.
  refuseUnstorableText(body);
  return body as JsonBody;
}

/** Field readers: each returns the value (undefined when absent or null) or refuses the type. */
export const field = {
  string(body: JsonBody, name: string): string | undefined {
    const v = body[name];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "string") throw invalid(`${name} must be a string`);
    return v;
  },
  int(body: JsonBody, name: string): number | undefined {
    const v = body[name];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !Number.isInteger(v) || Math.abs(v) > 2 ** 31 - 1) {
      throw invalid(`${name} must be a whole number`);
    }
    return v;
  },
  bool(body: JsonBody, name: string): boolean | undefined {
    const v = body[name];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "boolean") throw invalid(`${name} must be true or false`);
    return v;
  },
  strings(body: JsonBody, name: string): string[] | undefined {
    const v = body[name];
    if (v === undefined || v === null) return undefined;
    if (!Array.isArray(v) || v.some((s) => typeof s !== "string")) {
      throw invalid(`${name} must be a list of strings`);
    }
    return v as string[];
  },
  stringMap(body: JsonBody, name: string): Record<string, string> | undefined {
    const v = field.object(body, name);
    if (v === undefined) return undefined;
    for (const [k, s] of Object.entries(v)) {
      if (typeof s !== "string") throw invalid(`${name}.${k} must be a string`);
    }
    return v as Record<string, string>;
  },
  numberMap(body: JsonBody, name: string): Record<string, number> | undefined {
    const v = field.object(body, name);
    if (v === undefined) return undefined;
    for (const [k, n] of Object.entries(v)) {
      if (typeof n !== "number") throw invalid(`${name}.${k} must be a number`);
    }
    return v as Record<string, number>;
  },
  /** Resource name → whole quantity (resources, capacity), as protobuf's map<string, int64>. */
  quantities(body: JsonBody, name: string): Record<string, bigint> | undefined {
    const v = field.object(body, name);
    if (v === undefined) return undefined;
    const out: Record<string, bigint> = {};
    for (const [k, n] of Object.entries(v)) {
      if (typeof n !== "number" || !Number.isSafeInteger(n)) {
        throw invalid(`${name}.${k} must be a whole number`);
      }
      out[k] = BigInt(n);
    }
    return out;
  },
  /**
   * Label requirements: `[{"key", "operator", "values"}]`, the operator as
   * Kubernetes spells it (In, NotIn, Exists, DoesNotExist, Gt, Lt) or as
   * the enum does (OPERATOR_IN, …).
   */
  requirements(body: JsonBody, name: string) {
    const v = body[name];
    if (v === undefined || v === null) return undefined;
    if (!Array.isArray(v)) throw invalid(`${name} must be a list`);
    return v.map((r, i) => requirementOf(r, `${name}[${i}]`));
  },
  /** Preferences: `[{"weight", "requirement": {...}}]`. */
  preferences(body: JsonBody, name: string) {
    const v = body[name];
    if (v === undefined || v === null) return undefined;
    if (!Array.isArray(v)) throw invalid(`${name} must be a list`);
    return v.map((p, i) => {
      if (typeof p !== "object" || p === null) throw invalid(`${name}[${i}] must be an object`);
      const entry = p as JsonBody;
      return {
        weight: field.int(entry, "weight") ?? 0,
        requirement: requirementOf(entry.requirement, `${name}[${i}].requirement`),
      };
    });
  },
  object(body: JsonBody, name: string): JsonBody | undefined {
    const v = body[name];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "object" || Array.isArray(v)) throw invalid(`${name} must be a JSON object`);
    return v as JsonBody;
  },
  /** An RFC 3339 time. */
  time(body: JsonBody, name: string): Date | undefined {
    const v = field.string(body, name);
    if (v === undefined) return undefined;
    const at = parseTime(v);
    if (!at) throw invalid(`${name} must be an RFC 3339 time such as 2026-07-23T12:05:00Z`);
    return at;
  },
};

/** An operator's REST spelling (Kubernetes', or the enum's), as the enum. */
function operatorOf(text: unknown, at: string): Operator {
  if (typeof text !== "string") throw invalid(`${at}.operator must be a string`);
  const upper = text
    .replace(/^OPERATOR_/i, "")
    .replace(/([a-z])([A-Z])/g, "$1_$2")
    .toUpperCase();
  const op = Operator[upper as keyof typeof Operator];
  if (op === undefined || op === Operator.UNSPECIFIED) {
    throw invalid(`${at}.operator must be In, NotIn, Exists, DoesNotExist, Gt or Lt`);
  }
  return op;
}

function requirementOf(r: unknown, at: string) {
  if (typeof r !== "object" || r === null || Array.isArray(r)) {
    throw invalid(`${at} must be an object {"key", "operator", "values"}`);
  }
  const entry = r as JsonBody;
  return {
    key: field.string(entry, "key") ?? "",
    operator: operatorOf(entry.operator, at),
    values: field.strings(entry, "values") ?? [],
  };
}

/** A stored operator as REST writes it: In, NotIn, Exists, DoesNotExist, Gt, Lt. */
export function operatorName(op: Operator): string {
  return (Operator[op] ?? "")
    .toLowerCase()
    .replace(/(^|_)([a-z])/g, (_, _s, c: string) => c.toUpperCase());
}

const rfc3339 = /^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$/;

/** An RFC 3339 time with a zone (Z or an offset), or undefined. */
export function parseTime(value: string): Date | undefined {
  if (!rfc3339.test(value)) return undefined;
  // Date keeps milliseconds: longer fractions are cut, not refused.
  const at = new Date(value.replace(/(\.\d{3})\d+/, "$1"));
  return Number.isNaN(at.getTime()) ? undefined : at;
}

/** RFC 3339 UTC in whole seconds, as the worker contract writes times: `2026-07-23T12:05:00Z`. */
export function secondsUtc(at: Date): string {
  return `${at.toISOString().slice(0, 19)}Z`;
}
