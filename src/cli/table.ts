import { type Timestamp, timestampDate } from "@bufbuild/protobuf/wkt";

/** Rows under a header, each column padded to its widest cell; the last column is not padded. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  return `${[header, ...rows].map(line).join("\n")}\n`;
}

/** "key: value" lines with the keys aligned, for one record. */
export function record(pairs: [string, string][]): string {
  const width = Math.max(...pairs.map(([k]) => k.length)) + 1;
  return pairs
    .map(([k, v]) => `${`${k}:`.padEnd(width)} ${v}`.trimEnd())
    .join("\n")
    .concat("\n");
}

/** "12s ago", "3m ago", "in 2h"; "-" when unset. */
export function ago(t: Timestamp | undefined, now: number = Date.now()): string {
  if (!t) return "-";
  const ms = now - timestampDate(t).getTime();
  const s = Math.round(Math.abs(ms) / 1000);
  const text =
    s < 60
      ? `${s}s`
      : s < 3600
        ? `${Math.floor(s / 60)}m`
        : s < 86400
          ? `${Math.floor(s / 3600)}h`
          : `${Math.floor(s / 86400)}d`;
  return ms >= 0 ? `${text} ago` : `in ${text}`;
}

/** ISO 8601 in UTC, with how long ago in brackets; "-" when unset. */
export function when(t: Timestamp | undefined): string {
  return t ? `${timestampDate(t).toISOString()} (${ago(t)})` : "-";
}

/** The readable name of an enum value: "RUNNING" for TaskState.RUNNING. */
export function enumName(e: Record<number, string>, value: number): string {
  return e[value] ?? String(value);
}
