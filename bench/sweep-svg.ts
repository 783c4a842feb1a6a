/**
 * Draws the sweep of `npm run bench:compare` (BENCH_SCENARIOS=sweep) as an
 * SVG line chart, by hand: one line per batch size (max_tasks), x = workers
 * (evenly spaced, as measured), y = tasks/s from 0.
 *
 *   npx tsx bench/sweep-svg.ts [bench/results/sweep-<date>.json] [out.svg]
 *
 * Without arguments it reads the newest bench/results/sweep-*.json and
 * writes bench/sweep.svg. bench/compare.ts calls drawSweep() after a sweep.
 */
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export interface SweepPoint {
  workers: number;
  batch: number;
  /** Tasks drained for this point. */
  tasks: number;
  tasks_per_s: number;
}

export interface SweepResults {
  date: string;
  database: string;
  points: SweepPoint[];
}

const colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

/** A "nice" step (1, 2 or 5 × 10^k) giving about `ticks` ticks up to `max`. */
function niceStep(max: number, ticks: number): number {
  const raw = Math.max(max, 1) / ticks;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const m = raw / magnitude;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * magnitude;
}

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;");

export function drawSweep(r: SweepResults): string {
  const width = 640;
  const height = 400;
  const left = 70;
  const right = 130;
  const top = 40;
  const bottom = 55;
  const plotW = width - left - right;
  const plotH = height - top - bottom;
  const workers = [...new Set(r.points.map((p) => p.workers))].sort((a, b) => a - b);
  const batches = [...new Set(r.points.map((p) => p.batch))].sort((a, b) => a - b);
  const step = niceStep(Math.max(...r.points.map((p) => p.tasks_per_s)), 5);
  const yMax = Math.ceil(Math.max(...r.points.map((p) => p.tasks_per_s), 1) / step) * step;
  const x = (w: number) =>
    left + (workers.length === 1 ? plotW / 2 : (workers.indexOf(w) / (workers.length - 1)) * plotW);
  const y = (v: number) => top + plotH - (v / yMax) * plotH;
  const out: string[] = [];
  const title = esc(`Meshwork drain, claims of N + CompleteTasks, ${r.database}, ${r.date}`);
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<title>${title}: tasks/s against workers, one line per batch size</title>`,
    `<rect width="${width}" height="${height}" fill="white"/>`,
    `<text x="${left + plotW / 2}" y="22" text-anchor="middle" font-size="14">${title}</text>`,
  );
  // Grid and y axis labels.
  for (let v = 0; v <= yMax; v += step) {
    out.push(
      `<line x1="${left}" y1="${y(v)}" x2="${left + plotW}" y2="${y(v)}" stroke="#ddd"/>`,
      `<text x="${left - 8}" y="${y(v) + 4}" text-anchor="end">${v}</text>`,
    );
  }
  // Axes.
  out.push(
    `<line x1="${left}" y1="${top}" x2="${left}" y2="${top + plotH}" stroke="black"/>`,
    `<line x1="${left}" y1="${top + plotH}" x2="${left + plotW}" y2="${top + plotH}" stroke="black"/>`,
  );
  for (const w of workers) {
    out.push(
      `<line x1="${x(w)}" y1="${top + plotH}" x2="${x(w)}" y2="${top + plotH + 5}" stroke="black"/>`,
      `<text x="${x(w)}" y="${top + plotH + 20}" text-anchor="middle">${w}</text>`,
    );
  }
  out.push(
    `<text x="${left + plotW / 2}" y="${height - 12}" text-anchor="middle">workers</text>`,
    `<text x="18" y="${top + plotH / 2}" text-anchor="middle" transform="rotate(-90 18 ${top + plotH / 2})">tasks/s</text>`,
  );
  // One line per batch size, with its legend entry.
  batches.forEach((b, i) => {
    const colour = colours[i % colours.length];
    const pts = r.points
      .filter((p) => p.batch === b)
      .sort((p, q) => p.workers - q.workers)
      .map((p) => `${x(p.workers).toFixed(1)},${y(p.tasks_per_s).toFixed(1)}`);
    out.push(
      `<polyline points="${pts.join(" ")}" fill="none" stroke="${colour}" stroke-width="2"/>`,
    );
    for (const pt of pts) {
      const [cx, cy] = pt.split(",");
      out.push(`<circle cx="${cx}" cy="${cy}" r="3" fill="${colour}"/>`);
    }
    const ly = top + 10 + i * 20;
    out.push(
      `<line x1="${left + plotW + 15}" y1="${ly}" x2="${left + plotW + 40}" y2="${ly}" stroke="${colour}" stroke-width="2"/>`,
      `<text x="${left + plotW + 46}" y="${ly + 4}">batch ${b}</text>`,
    );
  });
  out.push("</svg>");
  return `${out.join("\n")}\n`;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const dir = "bench/results";
  const input =
    process.argv[2] ??
    join(
      dir,
      readdirSync(dir)
        .filter((f) => /^sweep-.*\.json$/.test(f))
        .sort()
        .at(-1) ?? "",
    );
  const output = process.argv[3] ?? "bench/sweep.svg";
  writeFileSync(output, drawSweep(JSON.parse(readFileSync(input, "utf8")) as SweepResults));
  process.stdout.write(`${output} drawn from ${input}\n`);
}
