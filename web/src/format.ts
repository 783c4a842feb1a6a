import { type Duration, type Timestamp, timestampDate } from "@bufbuild/protobuf/wkt";
import { WorkerState } from "../../gen/meshwork/v1/fleet_pb.js";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { h } from "./dom.js";

/** "RUNNING" for TaskState.RUNNING. */
export function taskStateName(state: TaskState): string {
  return (TaskState[state] ?? "UNSPECIFIED").toString();
}

/** The task states a user can filter on, in life order. */
export const taskStates = [
  TaskState.PENDING,
  TaskState.ASSIGNED,
  TaskState.RUNNING,
  TaskState.SUCCEEDED,
  TaskState.FAILED,
  TaskState.CANCELED,
];

export const terminal = new Set([TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED]);

/** A coloured pill for a task state (colours in style.css, one per state). */
export function statePill(state: TaskState) {
  const name = taskStateName(state);
  return h("span", { class: `pill state-${name.toLowerCase()}` }, name);
}

/** A coloured pill for a worker state. */
export function workerPill(state: WorkerState) {
  const name = (WorkerState[state] ?? "UNSPECIFIED").toString();
  return h("span", { class: `pill worker-${name.toLowerCase()}` }, name);
}

/** Milliseconds since the epoch of a timestamp, or undefined. */
export function ms(t: Timestamp | undefined): number | undefined {
  return t ? timestampDate(t).getTime() : undefined;
}

/** "4 s", "3 min 5 s", "2 h 10 min", "3 d 4 h". */
export function span(millis: number): string {
  const s = Math.max(0, Math.round(millis / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m} min ${s % 60} s` : `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** "3 s ago" (or "in 3 s" for the future); "—" without a time. */
export function ago(t: Timestamp | undefined, now = Date.now()): string {
  const at = ms(t);
  if (at === undefined) return "—";
  return at > now + 500 ? `in ${span(at - now)}` : `${span(now - at)} ago`;
}

/** A time element: relative text, the exact UTC time on hover. */
export function when(t: Timestamp | undefined) {
  const at = ms(t);
  if (at === undefined) return h("span", { class: "muted" }, "—");
  const iso = new Date(at).toISOString();
  return h(
    "time",
    { datetime: iso, title: iso.replace("T", " ").replace(/\.\d+Z$/, " UTC") },
    ago(t),
  );
}

/** The exact time, "2026-12-01 10:44:53 UTC". */
export function exact(t: Timestamp | undefined): string {
  const at = ms(t);
  return at === undefined
    ? "—"
    : new Date(at)
        .toISOString()
        .replace("T", " ")
        .replace(/\.\d+Z$/, " UTC");
}

export function durationMs(d: Duration | undefined): number {
  return d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : 0;
}

/** "1.2 MiB". */
export function bytes(n: bigint | number): string {
  let v = Number(n);
  for (const unit of ["B", "KiB", "MiB", "GiB"]) {
    if (v < 1024 || unit === "GiB") return unit === "B" ? `${v} B` : `${v.toFixed(1)} ${unit}`;
    v /= 1024;
  }
  return `${v} B`;
}

/** The first 8 characters of a UUID, the whole one on hover. */
export function shortId(id: string) {
  return h("code", { title: id }, id.slice(0, 8));
}

/**
 * A small bar filled to `fraction` (0–1). The width is set through the
 * CSSOM: the Content-Security-Policy refuses style attributes.
 */
export function meter(fraction: number, wide = false) {
  const fill = h("span");
  fill.style.width = `${Math.round(Math.max(0, Math.min(1, fraction)) * 100)}%`;
  return h("span", { class: wide ? "meter wide" : "meter" }, fill);
}
