import type { PreferenceJson, RequirementJson, Resources } from "../db/schema/index.js";
import { invalid } from "./errors.js";
import { text } from "./validate.js";

/**
 * The scheduling fields' rules (docs/scheduling.md), checked once for every
 * surface (RPCs, both REST contracts, the CLI): resources and capacity,
 * label requirements and preferences, share paths, limit keys. Each
 * returns the value as stored or throws `invalid_argument` naming the field.
 */

/** A resource name: `cpu`, `memory`, `gpu`, `slots`, or a name of the fleet's own. */
export const resourceNamePattern = /^[a-z0-9][a-z0-9._/-]{0,62}$/;

/** The largest quantity of a resource: exact in a JavaScript number and in PostgreSQL's bigint. */
export const maxQuantity = 1e15;

/** The most resource names, requirements or preferences one task or worker states. */
export const maxEntries = 32;

function quantity(field: string, name: string, value: bigint | number): number {
  const n = typeof value === "bigint" ? Number(value) : value;
  if (!Number.isInteger(n) || n < 0 || n > maxQuantity) {
    throw invalid(`${field}[${name}] must be a whole number from 0 to 10^15, not ${value}`);
  }
  return n;
}

function resourceMap(field: string, map: Record<string, bigint | number>): Resources {
  const entries = Object.entries(map);
  if (entries.length > maxEntries) throw invalid(`${field} has more than ${maxEntries} entries`);
  const out: Resources = {};
  for (const [name, value] of entries) {
    if (!resourceNamePattern.test(name)) {
      throw invalid(
        `${field} key ${JSON.stringify(name.slice(0, 64))} must match [a-z0-9][a-z0-9._/-]{0,62} (cpu, memory, gpu, slots, or a name of your own)`,
      );
    }
    const n = quantity(field, name, value);
    if (n > 0) out[name] = n;
  }
  return out;
}

/**
 * A task's resources, as stored: zero quantities left out, `slots` 1 when
 * not given (it must be at least 1: every task takes a slot).
 */
export function taskResources(field: string, map: Record<string, bigint | number>): Resources {
  const out = resourceMap(field, map);
  if ("slots" in map && out.slots === undefined) {
    throw invalid(`${field}[slots] must be at least 1: every task takes a slot`);
  }
  return { ...out, slots: out.slots ?? 1 };
}

/**
 * A worker's capacity, as stored: what it states, with `cpu` (cpu_count ×
 * 1000 millicores) and `memory` (memory_mb) filled in when it does not
 * state them, and without `slots`, which is its max_concurrency (returned
 * apart: undefined when not stated).
 */
export function workerCapacity(
  field: string,
  map: Record<string, bigint | number>,
  cpuCount: number,
  memoryMb: number,
): { capacity: Resources; slots: number | undefined } {
  const stated = resourceMap(field, map);
  const { slots, ...capacity } = stated;
  if (capacity.cpu === undefined && !("cpu" in map) && cpuCount > 0) capacity.cpu = cpuCount * 1000;
  if (capacity.memory === undefined && !("memory" in map) && memoryMb > 0) {
    capacity.memory = memoryMb;
  }
  return { capacity, slots: "slots" in map ? (slots ?? 0) : undefined };
}

/** The operators of a label requirement, by their stored name. */
export const operators = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] as const;
export type OperatorName = (typeof operators)[number];

const integerPattern = /^-?[0-9]{1,18}$/;

/** One requirement, checked: its operator's number of values (one integer for Gt and Lt). */
export function requirement(
  field: string,
  key: string,
  op: OperatorName | undefined,
  values: string[],
): RequirementJson {
  text(`${field}.key`, key);
  if (op === undefined) {
    throw invalid(`${field}.operator must be one of In, NotIn, Exists, DoesNotExist, Gt, Lt`);
  }
  if (values.length > 64) throw invalid(`${field}.values has more than 64 entries`);
  for (const v of values) text(`${field}.values entry`, v, { optional: true });
  if ((op === "In" || op === "NotIn") && values.length === 0) {
    throw invalid(`${field}.values must hold at least one value for ${op}`);
  }
  if ((op === "Exists" || op === "DoesNotExist") && values.length > 0) {
    throw invalid(`${field}.values must be empty for ${op}`);
  }
  if (
    (op === "Gt" || op === "Lt") &&
    (values.length !== 1 || !integerPattern.test(values[0] ?? ""))
  ) {
    throw invalid(`${field}.values must hold exactly one integer for ${op}`);
  }
  return { key, op, values: [...new Set(values)] };
}

/** A list of requirements or preferences: at most 32. */
export function entryCount(field: string, n: number): void {
  if (n > maxEntries) throw invalid(`${field} has more than ${maxEntries} entries`);
}

/** A preference's weight: 1–100, as Kubernetes' preferred node affinity. */
export function preference(field: string, weight: number, r: RequirementJson): PreferenceJson {
  if (!Number.isInteger(weight) || weight < 1 || weight > 100) {
    throw invalid(`${field}.weight must be from 1 to 100, not ${weight}`);
  }
  return { weight, ...r };
}

/** A segment of a share path: what a token name may be, not starting with a dot. */
const segmentPattern = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/;

/** The deepest a share path goes. */
export const maxShareDepth = 8;

/** Whether `path` is a share path: 1–8 segments joined by `/`. */
export function isSharePath(path: string): boolean {
  const segments = path.split("/");
  return segments.length <= maxShareDepth && segments.every((s) => segmentPattern.test(s));
}

/** A share path, checked. */
export function sharePath(field: string, path: string): string {
  if (!isSharePath(path)) {
    throw invalid(
      `${field} must be 1–8 segments of [A-Za-z0-9_-][A-Za-z0-9._-]{0,127} joined by /, not ${JSON.stringify(path.slice(0, 64))}`,
    );
  }
  return path;
}

/**
 * The share of a task whose creator names none and the coordinator sets no
 * --default-share: the creating token's name (a token name is a share path
 * of one segment), or `default` (auth off: the anonymous caller).
 */
export function shareOfCaller(tokenName: string): string {
  return tokenName !== "anonymous" && isSharePath(tokenName) ? tokenName : "default";
}

/** The ancestors of a share path and itself, root first: `a/b/c` → `a`, `a/b`, `a/b/c`. */
export function shareAncestry(path: string): string[] {
  const segments = path.split("/");
  return segments.map((_, i) => segments.slice(0, i + 1).join("/"));
}

/**
 * A concurrency or rate key: text of at most 256 characters without white
 * space at either end (a key that looks blank could never be given a
 * limit). On a task it may be empty (no key); ConcurrencyService's calls
 * require one (`required`).
 */
export function limitKey(field: string, key: string, { required = false } = {}): string {
  text(field, key, { optional: !required });
  if (key !== key.trim()) throw invalid(`${field} must not begin or end with white space`);
  return key;
}

/** A requirement in words: `gpu-model in (a100, h100)`, `has label spot`, `cores > 8`. */
export function describeRequirement(r: RequirementJson): string {
  switch (r.op) {
    case "In":
      return `${r.key} in (${r.values.join(", ")})`;
    case "NotIn":
      return `${r.key} not in (${r.values.join(", ")})`;
    case "Exists":
      return `has label ${r.key}`;
    case "DoesNotExist":
      return `has no label ${r.key}`;
    case "Gt":
      return `${r.key} > ${r.values[0] ?? ""}`;
    case "Lt":
      return `${r.key} < ${r.values[0] ?? ""}`;
  }
}

/**
 * Why what a task asks does not fit a worker, in words, one per resource
 * short: too small in all (`gpu 4 asked, 2 offered`), or not free now
 * (`gpu 2 asked, 1 free`); slots as `no free slot (used/max)`. `free` and
 * `total` are the database's (meshwork_free, meshwork_capacity); a worker
 * without a slot limit (max_concurrency 0) is never short of slots.
 */
export function describeShortfall(
  ask: Resources,
  free: Resources,
  total: Resources,
  maxConcurrency: number,
): string[] {
  const why: string[] = [];
  for (const [name, n] of Object.entries(ask)) {
    if (name === "slots") {
      const left = free.slots ?? 0;
      if (maxConcurrency !== 0 && left < n) {
        why.push(`no free slot (${maxConcurrency - Math.max(0, left)}/${maxConcurrency})`);
      }
      continue;
    }
    const offered = total[name] ?? 0;
    const available = free[name] ?? 0;
    if (offered < n) why.push(`too small: ${name} ${n} asked, ${offered} offered`);
    else if (available < n) why.push(`${name} ${n} asked, ${Math.max(0, available)} free`);
  }
  return why;
}

/**
 * A requirement as people type it (the CLI's --require, as kubectl's label
 * selectors): `key in (a,b)` (or `(a|b)`), `key notin (a)`, `key=v`,
 * `key!=v`, `key` (Exists), `!key` (DoesNotExist), `key>8`, `key<8`.
 * Undefined when the text is none of these.
 */
export function parseRequirement(
  text: string,
): { key: string; op: OperatorName; values: string[] } | undefined {
  const t = text.trim();
  const set = /^([^\s=!<>()]+)\s+(in|notin)\s+\(([^)]*)\)$/i.exec(t);
  if (set?.[1]) {
    const values = (set[3] ?? "")
      .split(/[,|]/)
      .map((v) => v.trim())
      .filter((v) => v !== "");
    return { key: set[1], op: set[2]?.toLowerCase() === "in" ? "In" : "NotIn", values };
  }
  const cmp = /^([^\s=!<>()]+)\s*(!=|=|==|>|<)\s*([^\s()]*)$/.exec(t);
  if (cmp?.[1]) {
    const op = cmp[2] === "!=" ? "NotIn" : cmp[2] === ">" ? "Gt" : cmp[2] === "<" ? "Lt" : "In";
    return { key: cmp[1], op, values: [cmp[3] ?? ""] };
  }
  const exists = /^(!?)([^\s=!<>()]+)$/.exec(t);
  if (exists?.[2]) return { key: exists[2], op: exists[1] ? "DoesNotExist" : "Exists", values: [] };
  return undefined;
}

/** A requirement written back as parseRequirement reads it. */
export function requirementText(r: { key: string; op: OperatorName; values: string[] }): string {
  switch (r.op) {
    case "In":
      return r.values.length === 1
        ? `${r.key}=${r.values[0]}`
        : `${r.key} in (${r.values.join(",")})`;
    case "NotIn":
      return r.values.length === 1
        ? `${r.key}!=${r.values[0]}`
        : `${r.key} notin (${r.values.join(",")})`;
    case "Exists":
      return r.key;
    case "DoesNotExist":
      return `!${r.key}`;
    case "Gt":
      return `${r.key}>${r.values[0] ?? ""}`;
    case "Lt":
      return `${r.key}<${r.values[0] ?? ""}`;
  }
}
