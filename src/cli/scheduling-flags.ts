import {
  type LabelRequirement,
  type Task,
  WaitKind,
  type WaitReason,
} from "../../gen/meshwork/v1/task_pb.js";
import { parseRequirement, requirementText } from "../core/scheduling.js";
import { operatorName, toRequirement } from "../tasks/convert.js";
import { UsageError } from "./args.js";

// The scheduling flags of `meshwork task create` and `meshwork work`, and
// how `meshwork task` shows a task's scheduling (docs/scheduling.md).

/** `cpu=2000,gpu=1` (or several flags) as a resource map. */
export function quantities(flag: string, texts: readonly string[]): Record<string, bigint> {
  const out: Record<string, bigint> = {};
  for (const part of texts.flatMap((t) => t.split(","))) {
    const m = /^\s*([^=\s]+)\s*=\s*([0-9]{1,16})\s*$/.exec(part);
    if (!m?.[1]) {
      throw new UsageError(
        `--${flag} takes NAME=QUANTITY pairs (cpu=2000,gpu=1), not ${JSON.stringify(part)}`,
      );
    }
    out[m[1]] = BigInt(m[2] ?? "0");
  }
  return out;
}

/** A --require flag: `model in (a100,h100)`, `zone=eu`, `spot`, `!spot`, `cores>8`. */
export function requirementFlag(text: string): LabelRequirement {
  const r = parseRequirement(text);
  if (!r) {
    throw new UsageError(
      `--require takes KEY in (A,B), KEY notin (A), KEY=V, KEY!=V, KEY, !KEY, KEY>N or KEY<N, not ${JSON.stringify(text)}`,
    );
  }
  return toRequirement(r);
}

/** A --prefer flag: `WEIGHT:REQUIREMENT`, e.g. `50:disk=ssd`. */
export function preferenceFlag(text: string) {
  const m = /^\s*(\d{1,3})\s*:(.*)$/.exec(text);
  if (!m)
    throw new UsageError(
      `--prefer takes WEIGHT:REQUIREMENT (50:disk=ssd), not ${JSON.stringify(text)}`,
    );
  return { weight: Number(m[1]), requirement: requirementFlag(m[2] ?? "") };
}

/** A requirement as --require writes it. */
export function requirementWords(r: LabelRequirement): string {
  return requirementText({ key: r.key, op: operatorName(r.operator) ?? "In", values: r.values });
}

const mapText = (m: Record<string, bigint>) =>
  Object.entries(m)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([k, v]) => `${k}=${v}`)
    .join(",");

/** The "key: value" lines of a task's scheduling, for `task get`. */
export function schedulingLines(t: Task): [string, string][] {
  const lines: [string, string][] = [
    ["resources", mapText(t.resources)],
    ["share", t.share],
  ];
  if (t.requirements.length > 0) {
    lines.push(["requires", t.requirements.map(requirementWords).join("; ")]);
  }
  if (t.preferences.length > 0) {
    lines.push([
      "prefers",
      t.preferences
        .map((p) => `${p.weight}:${p.requirement ? requirementWords(p.requirement) : ""}`)
        .join("; "),
    ]);
  }
  if (t.concurrencyKey) lines.push(["concurrency key", t.concurrencyKey]);
  if (t.rateKey) lines.push(["rate key", t.rateKey]);
  return lines;
}

/** A waiting reason's kind in words: `no capacity`. */
export const waitKindName = (k: WaitKind) =>
  (WaitKind[k] ?? String(k)).toLowerCase().replace(/_/g, " ");

/** Why a PENDING task waits, one line each (`task why`). */
export function waitingText(waiting: readonly WaitReason[], queuePosition: number): string {
  if (queuePosition === 0) return "not waiting: the task is not PENDING\n";
  const head = `position ${queuePosition} in its share's queue\n`;
  if (waiting.length === 0)
    return `${head}nothing holds it back: the next claim of a fitting worker takes it\n`;
  return head + waiting.map((w) => `${waitKindName(w.kind)}: ${w.message}\n`).join("");
}
