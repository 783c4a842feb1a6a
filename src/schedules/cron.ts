import { Cron } from "croner";
import { invalid } from "../core/errors.js";

/**
 * A tick is on time when the ticker reaches it at most this late; an older
 * one was missed (no replica was running, or the database was away), and
 * the schedule's catch-up policy says what becomes of it. A replica ticks
 * every second, so a running fleet is never this late.
 */
export const onTimeMs = 60_000;

/** Ticks of one pass that a catch-up may add, and on-time ticks it walks, at most. */
const maxOnTime = 1000;

export type CatchUpName = "SKIP" | "ONE" | "ALL";

/**
 * Checks a time zone name against the IANA database the runtime knows
 * (`Intl`), the same one croner reads; "" is UTC.
 */
export function timeZoneField(field: string, zone: string): string {
  if (zone === "") return "UTC";
  if (zone.length > 64) throw invalid(`${field} is longer than 64 characters`);
  try {
    new Intl.DateTimeFormat("en-US", { timeZone: zone });
  } catch {
    throw invalid(`${field} ${JSON.stringify(zone)} is not an IANA time zone (e.g. Europe/Paris)`);
  }
  return zone;
}

/**
 * Parses a cron expression in a time zone with croner: 5 fields (minute
 * first), 6 (seconds first), or a nickname (`@hourly`, `@daily`, …). An
 * expression that never fires is refused too: it would never tick.
 */
export function compileCron(cron: string, zone: string, field = "cron"): Cron {
  const expr = cron.trim();
  if (expr === "") throw invalid(`${field} is required`);
  if (expr.length > 256) throw invalid(`${field} is longer than 256 characters`);
  const parts = expr.split(/\s+/).length;
  if (!expr.startsWith("@") && parts !== 5 && parts !== 6) {
    throw invalid(
      `${field} ${JSON.stringify(cron)} must have 5 fields (minute hour day-of-month month day-of-week), 6 (seconds first) or be @hourly, @daily, …`,
    );
  }
  let compiled: Cron;
  try {
    compiled = new Cron(expr, { mode: "5-or-6-parts", timezone: zone, paused: true });
  } catch (error) {
    const why = error instanceof Error ? error.message.replace(/^Cron\w*: /, "") : "";
    throw invalid(`${field} ${JSON.stringify(cron)} is not a valid cron expression: ${why}`);
  }
  if (!compiled.nextRun(new Date())) throw invalid(`${field} ${JSON.stringify(cron)} never fires`);
  return compiled;
}

/** The first tick strictly after `after`, or null when the expression fires no more. */
export function nextTick(cron: Cron, after: Date): Date | null {
  return cron.nextRun(after) ?? null;
}

/** What one pass of the ticker runs for a due schedule. */
export interface TickPlan {
  /** The ticks to run, oldest first. */
  ticks: Date[];
  /** The schedule's next tick, strictly after now (null: none). */
  next: Date | null;
}

/**
 * The ticks a due schedule runs now, oldest first: the missed ones its
 * catch-up policy keeps, none (SKIP), the latest (ONE: one task stands for
 * them all) or the latest `limit` (ALL), then every on-time tick (due
 * within `onTimeMs` of now). `due` is the schedule's next_run_at: its first
 * tick (the cron gives the ones after it).
 */
export function planTicks(
  cron: Cron,
  due: Date,
  now: Date,
  policy: CatchUpName,
  limit: number,
): TickPlan {
  const edge = new Date(Math.max(due.getTime(), now.getTime() - onTimeMs));
  const onTime: Date[] = [];
  let t: Date | null = due >= edge ? due : cron.nextRun(new Date(edge.getTime() - 1));
  while (t && t <= now && onTime.length < maxOnTime) {
    onTime.push(t);
    t = cron.nextRun(t);
  }
  const keep = Math.min(policy === "ALL" ? limit : policy === "ONE" ? 1 : 0, maxOnTime);
  let missed: Date[] = [];
  if (due < edge && keep > 0) {
    missed = cron
      .previousRuns(keep, edge)
      .filter((d) => d > due)
      .reverse();
    if (missed.length < keep) missed.unshift(due);
  }
  return { ticks: [...missed, ...onTime], next: nextTick(cron, now) };
}
