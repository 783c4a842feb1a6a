import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { LogLine } from "../../gen/meshwork/v1/task_pb.js";
import { invalid } from "../core/errors.js";
import { leaseToken } from "../core/lease-ref.js";
import { attemptField, timeField, uuidField } from "../core/validate.js";
import type { LogStream, NewLogLine } from "./store.js";

/** The longest line kept, in UTF-8 bytes; a longer one is cut and ends with `…`. */
export const maxLineBytes = 8 * 1024;

const streams: readonly LogStream[] = ["stdout", "stderr", "log"];

/** Lone UTF-16 surrogates (no UTF-8 form; jsonb refuses their escapes). */
const loneSurrogates = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/**
 * A line's text as kept: lone surrogates replaced by U+FFFD, at most
 * 8 KiB of UTF-8, cut on a character boundary and marked with `…`. A line
 * is a user's data: it is stored, never logged or judged.
 */
export function lineText(text: string): string {
  const clean = text.replace(loneSurrogates, "\uFFFD");
  // A UTF-16 unit is at most 3 UTF-8 bytes: most lines need no counting.
  if (clean.length * 3 <= maxLineBytes) return clean;
  const bytes = Buffer.from(clean, "utf8");
  if (bytes.length <= maxLineBytes) return clean;
  let end = maxLineBytes - 3; // room for "…" (3 bytes)
  // Back to the first byte of a character (continuation bytes are 10xxxxxx).
  while (end > 0 && ((bytes[end] ?? 0) & 0xc0) === 0x80) end--;
  return `${bytes.subarray(0, end).toString("utf8")}…`;
}

/**
 * A LogLine as sent, checked: the lease it names (task_id, attempt,
 * worker_id, lease_token), its stream (`stdout`, `stderr` or `log`, empty
 * meaning `log`), its time. Malformed fields are `invalid_argument`; a
 * lease the sender does not hold is not judged here (the INSERT drops it).
 * `worker` stands for an empty worker_id (StreamLeases: the stream's worker).
 */
export function parseLogLine(line: LogLine, field: string, worker?: string): NewLogLine {
  const stream = line.stream === "" ? "log" : line.stream;
  if (!(streams as readonly string[]).includes(stream)) {
    throw invalid(`${field}stream must be stdout, stderr or log`);
  }
  const workerId =
    worker !== undefined && line.workerId === ""
      ? worker
      : uuidField(`${field}worker_id`, line.workerId);
  if (worker !== undefined && workerId !== worker) {
    throw invalid(`${field}worker_id must be empty or the stream's worker_id`);
  }
  return {
    taskId: uuidField(`${field}task_id`, line.taskId),
    attempt: attemptField(`${field}attempt`, line.attempt),
    workerId,
    token: leaseToken(`${field}lease_token`, line.leaseToken),
    stream: stream as LogStream,
    text: lineText(line.text),
    at: line.time ? timeField(`${field}time`, timestampDate(line.time)) : undefined,
    keep: true,
  };
}

/**
 * The lines a task may send per second, per replica: a token bucket per
 * task and worker (another worker's lines never spend the holder's)
 * holding 10 seconds of lines. A line past it is dropped and counted
 * (GetTaskLogsResponse.dropped), not refused: the RATE_LIMITED refusal is
 * for whole calls. 0 means no limit.
 */
export function createLineBudget(perSecond: number, now: () => number = Date.now) {
  const burst = perSecond * 10;
  const buckets = new Map<string, { tokens: number; at: number }>();
  let lastSweep = now();
  return {
    /** Takes one line from the budget named `key`; false when none is left. */
    take(key: string): boolean {
      if (perSecond <= 0) return true;
      const t = now();
      // Buckets full again are forgotten, now and then.
      if (t - lastSweep > 60_000) {
        lastSweep = t;
        for (const [id, b] of buckets) {
          if (b.tokens + ((t - b.at) / 1000) * perSecond >= burst) buckets.delete(id);
        }
      }
      const b = buckets.get(key) ?? { tokens: burst, at: t };
      b.tokens = Math.min(burst, b.tokens + ((t - b.at) / 1000) * perSecond);
      b.at = t;
      buckets.set(key, b);
      if (b.tokens < 1) return false;
      b.tokens -= 1;
      return true;
    },
  };
}

export type LineBudget = ReturnType<typeof createLineBudget>;

/**
 * Marks the lines past a task's budget, and of a batch holding more than
 * `cap` lines of one task, all but its last `cap` (they would be dropped
 * by the cap at once): both are counted as dropped, not stored.
 */
export function budgeted(lines: NewLogLine[], budget: LineBudget, cap: number): NewLogLine[] {
  const perTask = new Map<string, number>();
  for (const l of lines) perTask.set(l.taskId, (perTask.get(l.taskId) ?? 0) + 1);
  const seen = new Map<string, number>();
  return lines.map((l) => {
    const n = (seen.get(l.taskId) ?? 0) + 1;
    seen.set(l.taskId, n);
    const cut = (perTask.get(l.taskId) ?? 0) - n >= cap;
    return { ...l, keep: !cut && budget.take(`${l.taskId}/${l.workerId}`) };
  });
}
