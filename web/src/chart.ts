import type { GetFleetStatusResponse } from "../../gen/meshwork/v1/fleet_pb.js";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { fleet } from "./api.js";
import { h, s } from "./dom.js";
import { span } from "./format.js";

/** One look at the fleet: cumulative finished tasks, and pending and running now. */
export interface Sample {
  t: number;
  finished: number;
  pending: number;
  running: number;
}

/** How often the browser samples GetFleetStatus, and how much history it keeps. */
export const sampleEveryMs = 5000;
export const keepMs = 10 * 60_000;
const storeKey = "meshwork.samples";

let samples: Sample[] = load();
let timer: number | undefined;
const listeners = new Set<() => void>();

function load(): Sample[] {
  try {
    const parsed = JSON.parse(sessionStorage.getItem(storeKey) ?? "[]") as Sample[];
    return Array.isArray(parsed) ? parsed.filter((x) => x.t > Date.now() - keepMs) : [];
  } catch {
    return [];
  }
}

async function sample(): Promise<void> {
  record(await fleet.getFleetStatus({}));
}

/**
 * Adds one look at the fleet to the history. The fleet page gives the
 * status it read itself, so that its counts and the chart's legend come
 * from the same read; one taken within a second of the last replaces it.
 */
export function record(status: GetFleetStatusResponse): void {
  const count = (...states: TaskState[]) =>
    status.taskCounts
      .filter((c) => states.includes(c.state))
      .reduce((sum, c) => sum + Number(c.count), 0);
  const now = Date.now();
  if (samples.length > 0 && now - (samples.at(-1)?.t ?? 0) < 1000) samples.pop();
  samples.push({
    t: now,
    finished: count(TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED),
    pending: count(TaskState.PENDING),
    running: count(TaskState.RUNNING, TaskState.ASSIGNED),
  });
  samples = samples.filter((x) => x.t > now - keepMs);
  // Kept for the tab's session, so a reload does not lose the last minutes.
  sessionStorage.setItem(storeKey, JSON.stringify(samples));
  for (const l of listeners) l();
}

/**
 * Samples GetFleetStatus every 5 s while signed in, whatever the page: the
 * coordinator keeps no history, so the chart shows what this tab saw over
 * the last 10 minutes.
 */
export function startSampling(): void {
  if (timer !== undefined) return;
  const tick = () => void sample().catch(() => {});
  tick();
  timer = window.setInterval(tick, sampleEveryMs);
}

export function stopSampling(): void {
  window.clearInterval(timer);
  timer = undefined;
  samples = [];
  sessionStorage.removeItem(storeKey);
}

/** Calls `fn` after each sample until `signal` aborts. */
export function onSample(fn: () => void, signal: AbortSignal): void {
  listeners.add(fn);
  signal.addEventListener("abort", () => listeners.delete(fn), { once: true });
}

/**
 * Throughput (tasks finished per 5 s interval, bars) and backlog (pending
 * tasks, line; running, dashed) over the last 10 minutes (less while this
 * tab has seen less), hand-drawn SVG.
 */
export function chart(): HTMLElement {
  const W = 1000;
  const H = 150;
  const pad = { l: 34, r: 34, t: 10, b: 20 };
  const now = Date.now();
  // The window grows with the history this tab has, from 1 to 10 minutes.
  const windowMs = Math.min(keepMs, Math.max(60_000, now - (samples[0]?.t ?? now)));
  const plotW = W - pad.l - pad.r;
  const x = (t: number) => pad.l + ((t - (now - windowMs)) / windowMs) * plotW;
  const points = samples.slice(1).map((cur, i) => {
    const prev = samples[i] as Sample;
    return { t: cur.t, done: Math.max(0, cur.finished - prev.finished), gap: cur.t - prev.t };
  });
  const maxDone = Math.max(1, ...points.map((p) => p.done));
  const maxBacklog = Math.max(1, ...samples.map((p) => Math.max(p.pending, p.running)));
  const yL = (v: number) => H - pad.b - (v / maxDone) * (H - pad.t - pad.b);
  const yR = (v: number) => H - pad.b - (v / maxBacklog) * (H - pad.t - pad.b);
  const svg = s("svg", {
    viewBox: `0 0 ${W} ${H}`,
    class: "chart",
    role: "img",
    "aria-label": "Throughput and backlog over the last 10 minutes",
    preserveAspectRatio: "none",
  });
  for (let i = 0; i <= 5; i++) {
    const gx = x(now - (windowMs * i) / 5);
    svg.append(s("line", { x1: gx, x2: gx, y1: pad.t, y2: H - pad.b, class: "grid" }));
    const label = s("text", { x: gx, y: H - 5, class: "axis", "text-anchor": "middle" });
    label.textContent = i === 0 ? "now (time →)" : `−${span((windowMs * i) / 5)}`;
    svg.append(label);
  }
  svg.append(s("line", { x1: pad.l, x2: W - pad.r, y1: H - pad.b, y2: H - pad.b, class: "base" }));
  const barW = Math.max(2, (sampleEveryMs / windowMs) * plotW - 2);
  for (const p of points) {
    if (p.done === 0) continue;
    svg.append(
      s("rect", {
        x: x(p.t) - barW,
        y: yL(p.done),
        width: barW,
        height: H - pad.b - yL(p.done),
        class: "bar",
      }),
    );
  }
  const line = (key: "pending" | "running", cls: string) => {
    if (samples.length < 2) return;
    const d = samples.map(
      (p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${yR(p[key]).toFixed(1)}`,
    );
    svg.append(s("path", { d: d.join(""), class: cls }));
  };
  line("running", "line-running");
  line("pending", "line-pending");
  const scale = (text: string, xx: number, anchor: string) => {
    const t = s("text", { x: xx, y: pad.t + 8, class: "axis", "text-anchor": anchor });
    t.textContent = text;
    svg.append(t);
  };
  scale(String(maxDone), pad.l - 6, "end");
  scale(String(maxBacklog), W - pad.r + 6, "start");
  // Axis titles: bars on the left scale, lines on the right one, time below.
  const title = (text: string, xx: number, rotate: number, cls: string) => {
    const y = (H - pad.b + pad.t) / 2;
    const t = s("text", {
      x: xx,
      y,
      class: `axis-title ${cls}`,
      "text-anchor": "middle",
      transform: `rotate(${rotate} ${xx} ${y})`,
    });
    t.textContent = text;
    svg.append(t);
  };
  title("finished / 5 s", 10, -90, "left");
  title("tasks waiting / running", W - 8, 90, "right");
  const last = samples.at(-1);
  const lastDone = points.at(-1)?.done ?? 0;
  return h(
    "figure",
    { class: "chart-box" },
    h(
      "figcaption",
      null,
      h("strong", null, `Last ${span(windowMs)}`),
      h("span", { class: "key bar" }, `finished per 5 s (${lastDone} now)`),
      h("span", { class: "key line-pending" }, `pending (${last?.pending ?? "—"})`),
      h("span", { class: "key line-running" }, `running (${last?.running ?? "—"})`),
      samples.length < 2 && h("span", { class: "muted" }, "collecting samples every 5 s…"),
    ),
    svg,
  );
}
