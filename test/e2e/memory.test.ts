import type { ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { onPostgres, postgresUrl } from "../support/database.js";
import { spawnServe } from "../support/serve.js";

/**
 * The resident memory of an idle coordinator just started on an empty data
 * directory (bench/RESULTS.md, Memory): at most 300 MiB on the embedded
 * database, 150 MiB on PostgreSQL. Read from /proc, so on Linux only.
 */

const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) c.kill("SIGKILL");
});

const MiB = 1024 * 1024;
const limit = onPostgres ? 150 * MiB : 300 * MiB;

function rssOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1]) * 1024;
}

describe.skipIf(process.platform !== "linux")("idle memory", () => {
  it(`an idle coordinator holds at most ${limit / MiB} MiB resident`, async () => {
    const env = { ...process.env };
    delete env.DATABASE_URL;
    if (onPostgres && postgresUrl) env.DATABASE_URL = postgresUrl;
    const dataDir = join(mkdtempSync(join(tmpdir(), "meshwork-memory-")), "d");
    const { child, output } = spawnServe(["--listen", "127.0.0.1:0", "--data-dir", dataDir], env);
    children.push(child);
    const deadline = Date.now() + 90_000;
    let url: string | undefined;
    while (Date.now() < deadline && url === undefined) {
      url = /"url":"([^"]+)"/.exec(output())?.[1];
      if (url === undefined) await new Promise((r) => setTimeout(r, 100));
    }
    expect(url, output()).toBeDefined();
    let status = 0;
    while (Date.now() < deadline && status !== 200) {
      status = await fetch(`${url}/readyz`).then(
        (r) => r.status,
        () => 0,
      );
      if (status !== 200) await new Promise((r) => setTimeout(r, 100));
    }
    expect(status).toBe(200);
    await new Promise((r) => setTimeout(r, 2000));
    const rss = rssOf(child.pid as number);
    expect(rss, `VmRSS ${(rss / MiB).toFixed(1)} MiB`).toBeLessThanOrEqual(limit);
    child.kill("SIGTERM");
    await new Promise((r) => child.on("exit", r));
  }, 120_000);
});
