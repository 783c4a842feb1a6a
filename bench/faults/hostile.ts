/**
 * Fault scenarios of hostile and careless traffic, each against real
 * coordinator processes with auth on (their defaults otherwise), each
 * printing its figure:
 *
 * - flood: 40 h2c connections × 999 streams without a token and without a
 *   body, and 1,000 HTTP/1.1 bodies without a token dribbled a byte every
 *   2 s, at once: /healthz latency throughout, RSS before, at the peak and
 *   after.
 * - bad-tokens: a legitimate client's p50 quiet, then during a flood of
 *   random well-formed tokens from another address.
 * - revoke: a token's open StreamLeases and WatchTask streams, on another
 *   replica on PostgreSQL, after the token is revoked: how long until each
 *   ends with `unauthenticated`.
 * - burst (PostgreSQL): 1,000 StreamLeases streams (200 workers) and 2,000
 *   parked long polls, CreateTasks of 500 beside a CPU hog, twice: streams
 *   lost, GetFleetStatus latency, RSS after each round.
 * - disk-full: uploads onto a 1 MiB tmpfs (root only): the code, nothing kept.
 * - corrupt: a byte flipped in a stored blob: the download cut short, the
 *   blob refused after, `meshwork artifact verify` reporting it.
 *
 * Hostile clients run in child processes (attacker.ts, fleet.ts) and bind
 * 127.0.0.2, so that they neither slow this process's measurements nor
 * share the legitimate clients' address. Timings are checked only in the
 * full suite (`npm run faults`, run alone); --short reports them and checks
 * the rest.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

/** What run.ts passes in. */
export interface HostileContext {
  check(name: string, ok: boolean, detail?: string): void;
  short: boolean;
  /** PostgreSQL base URL, when there is one. */
  pgUrl: string | undefined;
  /** A fresh database URL on it (dropped by `drop`), or undefined for PGlite. */
  place(): Promise<{ url: string | undefined; drop(): Promise<void> }>;
}

const tsx = createRequire(import.meta.url).resolve("tsx/cli");
/**
 * The coordinator these scenarios start: this checkout's, or another
 * build's (FAULTS_COORDINATOR=/path/to/bin/meshwork.js), to measure a
 * before and an after the same way.
 */
const coordinatorBin = process.env.FAULTS_COORDINATOR ?? "bin/meshwork.js";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const mib = (bytes: number) => Math.round(bytes / 2 ** 20);
const children = new Set<ChildProcess>();
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});

function rssOf(pid: number): number {
  return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]) * 1024;
}

function quantile(sorted: number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
}

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

interface Coordinator {
  url: string;
  pid: number;
  token: string;
  dataDir: string;
  log(): string;
  stop(): Promise<number | null>;
}

/** A coordinator with auth on and its defaults, on `databaseUrl` (or PGlite). */
async function start(
  databaseUrl: string | undefined,
  flags: string[] = [],
  token?: string,
): Promise<Coordinator> {
  const dataDir = mkdtempSync(join(tmpdir(), "meshwork-hostile-"));
  const port = await freePort();
  const env = { ...process.env };
  delete env.DATABASE_URL;
  if (databaseUrl) env.DATABASE_URL = databaseUrl;
  let log = "";
  const child = spawn(
    process.execPath,
    [
      coordinatorBin,
      "serve",
      "--listen",
      `127.0.0.1:${port}`,
      "--data-dir",
      dataDir,
      "--log-format",
      "json",
      ...flags,
    ],
    { env, stdio: ["ignore", "pipe", "pipe"] },
  );
  children.add(child);
  child.stdout?.on("data", (d: Buffer) => {
    if (log.length < 4_000_000) log += d.toString();
  });
  child.stderr?.on("data", (d: Buffer) => {
    if (log.length < 4_000_000) log += d.toString();
  });
  const exited = new Promise<number | null>((r) => child.on("exit", (c) => r(c)));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 120_000;
  while (
    (await fetch(`${url}/readyz`).then(
      (r) => r.status,
      () => 0,
    )) !== 200
  ) {
    if (child.exitCode !== null || Date.now() > deadline) {
      throw new Error(`the coordinator did not start: ${log.slice(-2000)}`);
    }
    await sleep(200);
  }
  return {
    url,
    pid: child.pid ?? 0,
    token: token ?? readFileSync(join(dataDir, "admin.token"), "utf8").trim(),
    dataDir,
    log: () => log,
    async stop() {
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
      const code = await exited;
      clearTimeout(timer);
      children.delete(child);
      rmSync(dataDir, { recursive: true, force: true });
      return code;
    },
  };
}

/** One Connect JSON call with the coordinator's admin token (or `token`). */
async function call<T = Record<string, unknown>>(
  co: Coordinator,
  method: string,
  body: unknown,
  token = co.token,
): Promise<{ status: number; json: T; ms: number }> {
  const t = performance.now();
  const res = await fetch(`${co.url}/meshwork.v1.${method}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  const json = (await res.json()) as T;
  return { status: res.status, json, ms: performance.now() - t };
}

/** Runs a child script to its end and returns its last JSON line. */
async function runChild(script: string, args: string[]): Promise<Record<string, unknown>> {
  const child = spawn(process.execPath, [tsx, script, ...args], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  children.add(child);
  let out = "";
  child.stdout?.on("data", (d: Buffer) => {
    out += d.toString();
  });
  await new Promise((r) => child.on("exit", r));
  children.delete(child);
  const last = out.trim().split("\n").at(-1) ?? "{}";
  return JSON.parse(last) as Record<string, unknown>;
}

/** /healthz every 20 ms and the coordinator's RSS, until `stop`; then the figures. */
function probe(co: Coordinator) {
  const latencies: number[] = [];
  let peak = 0;
  let stop = false;
  const loop = (async () => {
    while (!stop) {
      const t = performance.now();
      await fetch(`${co.url}/healthz`, { signal: AbortSignal.timeout(10_000) }).then(
        (r) => r.text(),
        () => "",
      );
      latencies.push(performance.now() - t);
      peak = Math.max(peak, rssOf(co.pid));
      await sleep(20);
    }
  })();
  return {
    async end() {
      stop = true;
      await loop;
      const sorted = [...latencies].sort((a, b) => a - b);
      return {
        n: sorted.length,
        p50: quantile(sorted, 0.5),
        p99: quantile(sorted, 0.99),
        max: sorted.at(-1) ?? Number.NaN,
        peak,
      };
    },
  };
}

const engineOf = (url: string | undefined) => (url ? "postgres" : "pglite");

/** The no-token flood of streams and slow bodies. */
export async function flood(ctx: HostileContext): Promise<void> {
  const p = await ctx.place();
  const co = await start(p.url);
  try {
    await sleep(1000);
    const before = rssOf(co.pid);
    const watch = probe(co);
    const hold = ctx.short ? 8 : 15;
    const [streams, slow] = await Promise.all([
      runChild("bench/faults/attacker.ts", ["streams", co.url, "40", "999", String(hold)]),
      runChild("bench/faults/attacker.ts", ["slow", co.url, "1000", String(hold)]),
    ]);
    await sleep(2000);
    const health = await watch.end();
    const after = rssOf(co.pid);
    const label = `${engineOf(p.url)}: no-token flood (40 × 999 h2c streams, 1,000 slow HTTP/1.1 bodies) for ${hold} s`;
    const latency = `healthz p50 ${health.p50.toFixed(1)} ms, p99 ${health.p99.toFixed(1)} ms, max ${health.max.toFixed(0)} ms over ${health.n} probes`;
    if (ctx.short) console.log(`note ${label}: ${latency} (not checked in --short)`);
    else ctx.check(`${label}: /healthz p99 within 100 ms throughout`, health.p99 <= 100, latency);
    // Answering the 39,960 refused streams and 1,000 sockets grows the RSS
    // by 45–51 MiB on the 2-core CI machine (the collector's timing: the
    // heap it grew is not handed back within the 2 s), which a 50 MiB bound
    // failed one run in three, on this commit and on the one before. The
    // check is for growth that scales with the attack (streams kept open,
    // bodies buffered), not for the collector's timing.
    const bound = 64 * 2 ** 20;
    ctx.check(
      `${label}: RSS within 64 MiB of its start, at the peak and after`,
      health.peak - before <= bound && after - before <= bound,
      `start ${mib(before)} MiB, peak ${mib(health.peak)}, after ${mib(after)}`,
    );
    const s = slow as {
      answered: number;
      statuses: Record<string, number>;
      openAtEnd: number;
      sockets: number;
    };
    const refusedConnections = s.sockets - s.answered;
    ctx.check(
      `${label}: every slow body answered at once (401/429) or its connection refused (per-source cap), none held to the end`,
      s.answered > 0 &&
        Object.keys(s.statuses).every((k) => k === "401" || k === "429") &&
        s.openAtEnd === 0,
      `${s.answered} answered ${JSON.stringify(s.statuses)}, ${refusedConnections} connections refused, ${s.openAtEnd} open at the end`,
    );
    const st = streams as { opened: number; openAtEnd: number };
    ctx.check(
      `${label}: the streams were answered and the connections that kept failing closed`,
      st.openAtEnd < 40,
      `${st.opened} streams sent, ${st.openAtEnd} of 40 connections still open at the end`,
    );
    ctx.check(`${label}: the coordinator stops with exit 0`, (await co.stop()) === 0);
  } finally {
    await co.stop().catch(() => {});
    await p.drop();
  }
}

/** A legitimate client's latency quiet, then during a flood of bad tokens. */
export async function badTokens(ctx: HostileContext): Promise<void> {
  const p = await ctx.place();
  const co = await start(p.url);
  try {
    const measure = async (seconds: number) => {
      const lat: number[] = [];
      const until = Date.now() + seconds * 1000;
      while (Date.now() < until) {
        const r = await call(co, "TaskService/ListTasks", { pageSize: 1 });
        if (r.status === 200) lat.push(r.ms);
      }
      lat.sort((a, b) => a - b);
      return { p50: quantile(lat, 0.5), p99: quantile(lat, 0.99), n: lat.length };
    };
    const seconds = ctx.short ? 4 : 10;
    await measure(1);
    const quiet = await measure(seconds);
    const flooding = runChild("bench/faults/attacker.ts", [
      "tokens",
      co.url,
      "16",
      String(seconds + 1),
    ]);
    await sleep(500);
    const loud = await measure(seconds);
    const attack = (await flooding) as {
      sent: number;
      perSecond: number;
      statuses: Record<string, number>;
    };
    const ratio = loud.p50 / quiet.p50;
    const label = `${engineOf(p.url)}: a flood of bad tokens from another address (16 connections)`;
    const detail = `legit p50 ${quiet.p50.toFixed(2)} → ${loud.p50.toFixed(2)} ms (×${ratio.toFixed(2)}), p99 ${quiet.p99.toFixed(1)} → ${loud.p99.toFixed(1)} ms; attacker ${attack.sent} guesses (${attack.perSecond}/s): ${JSON.stringify(attack.statuses)}`;
    if (ctx.short) console.log(`note ${label}: ${detail} (ratio not checked in --short)`);
    else ctx.check(`${label}: the legitimate client's p50 within 2×`, ratio <= 2, detail);
    ctx.check(
      `${label}: past its budget the attacker gets 429 without lookups, and is slowed`,
      (attack.statuses["429"] ?? 0) > 0 && attack.perSecond < 1000,
      detail,
    );
    const lines = co
      .log()
      .split("\n")
      .filter((l) => l.includes("127.0.0.2"));
    ctx.check(
      `${label}: the failures are logged with the address, a few lines, not one per guess`,
      lines.length > 0 && lines.length <= 2 + 2 * seconds,
      `${lines.length} log lines name 127.0.0.2`,
    );
    await co.stop();
  } finally {
    await co.stop().catch(() => {});
    await p.drop();
  }
}

/** A revoked token's streams, on another replica when there is PostgreSQL. */
export async function revoke(ctx: HostileContext): Promise<void> {
  const p = await ctx.place();
  const a = await start(p.url);
  const b = p.url ? await start(p.url, [], a.token) : a;
  try {
    const mk = async (role: string, name: string) =>
      (await call<{ secret: string }>(a, "TokenService/CreateToken", { role, name })).json.secret;
    const workerToken = await mk("TOKEN_ROLE_WORKER", "to-revoke-worker");
    const clientToken = await mk("TOKEN_ROLE_CLIENT", "to-revoke-client");
    const workload = "revoked";
    const { workerId } = (
      await call<{ workerId: string }>(
        b,
        "FleetService/RegisterWorker",
        { capabilities: [workload] },
        workerToken,
      )
    ).json;
    const { task } = (
      await call<{ task: { taskId: string } }>(b, "TaskService/CreateTask", {
        workload,
        leaseSeconds: 5,
      })
    ).json;
    const { claims } = (
      await call<{ claims: { taskId: string; attempt: number; leaseToken: string }[] }>(
        b,
        "LeaseService/ClaimTasks",
        { workerId, maxTasks: 1 },
        workerToken,
      )
    ).json;
    const lease = claims[0];
    if (!lease) throw new Error("nothing claimed");
    const ended = await runChild("bench/faults/revoke-client.ts", [
      b.url,
      a.url,
      workerToken,
      clientToken,
      a.token,
      workerId,
      task.taskId,
      JSON.stringify(lease),
    ]);
    const r = ended as {
      stream: { code: string; ms: number; renewals: number };
      watch: { code: string; ms: number };
    };
    const label = `${engineOf(p.url)}: a token revoked${p.url ? " through another replica" : ""}`;
    const detail = `StreamLeases ended ${r.stream.code} ${r.stream.ms} ms after the revocation (${r.stream.renewals} renewals after it), WatchTask ${r.watch.code} after ${r.watch.ms} ms`;
    ctx.check(
      `${label}: its StreamLeases and WatchTask end with unauthenticated`,
      r.stream.code === "unauthenticated" && r.watch.code === "unauthenticated",
      detail,
    );
    if (ctx.short) console.log(`note ${label}: ${detail} (time not checked in --short)`);
    else {
      ctx.check(`${label}: within a second`, r.stream.ms <= 1000 && r.watch.ms <= 1000, detail);
    }
  } finally {
    if (b !== a) await b.stop().catch(() => {});
    await a.stop().catch(() => {});
    await p.drop();
  }
}

/** 1,000 lease streams and 2,000 parked polls, then bursts of tasks beside a CPU hog. */
export async function burst(ctx: HostileContext): Promise<void> {
  if (!ctx.pgUrl) {
    console.log("skip burst on PGlite (set DATABASE_URL)");
    return;
  }
  const p = await ctx.place();
  const co = await start(p.url);
  const hog = spawn(process.execPath, ["-e", "for(;;){}"], { stdio: "ignore" });
  children.add(hog);
  const [workers, streamsEach, pollsEach, tasks] = ctx.short
    ? [100, 5, 10, 300]
    : [200, 5, 10, 500];
  const fleet = spawn(
    process.execPath,
    [
      tsx,
      "bench/faults/fleet.ts",
      co.url,
      co.token,
      "burst",
      String(workers),
      String(streamsEach),
      String(pollsEach),
    ],
    { stdio: ["pipe", "pipe", "inherit"] },
  );
  children.add(fleet);
  try {
    const lines: string[] = [];
    let wake: (() => void) | undefined;
    createInterface({ input: fleet.stdout as NodeJS.ReadableStream }).on("line", (l) => {
      lines.push(l);
      wake?.();
    });
    const next = async () => {
      while (lines.length === 0) await new Promise<void>((r) => (wake = r));
      return JSON.parse(lines.shift() ?? "{}") as {
        stats: { streamsLost: Record<string, number>; claimed: number; completed: number };
      };
    };
    await next();
    await sleep(2000);
    const parked = rssOf(co.pid);
    const rounds: { ms: number; statusP50: number; statusMax: number; rss: number }[] = [];
    let last: Awaited<ReturnType<typeof next>> | undefined;
    for (let round = 1; round <= 2; round++) {
      const lat: number[] = [];
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          lat.push((await call(co, "FleetService/GetFleetStatus", {})).ms);
          await sleep(100);
        }
      })();
      const t0 = Date.now();
      await call(co, "TaskService/CreateTasks", {
        tasks: Array.from({ length: tasks }, () => ({ workload: "burst" })),
      });
      for (;;) {
        const s = await call<{ taskCounts: { state: string; count?: string }[] }>(
          co,
          "FleetService/GetFleetStatus",
          {},
        );
        const done = Number(
          s.json.taskCounts.find((c) => c.state === "TASK_STATE_SUCCEEDED")?.count ?? 0,
        );
        if (done >= tasks * round || Date.now() - t0 > 120_000) break;
        await sleep(200);
      }
      const ms = Date.now() - t0;
      await sleep(1000);
      sampling = false;
      await sampler;
      fleet.stdin?.write("x\n");
      last = await next();
      await sleep(3000);
      lat.sort((x, y) => x - y);
      rounds.push({
        ms,
        statusP50: quantile(lat, 0.5),
        statusMax: lat.at(-1) ?? 0,
        rss: rssOf(co.pid),
      });
    }
    fleet.stdin?.end();
    const closed = await next();
    await sleep(5000);
    const afterClose = rssOf(co.pid);
    const label = `postgres: ${workers * streamsEach} lease streams and ${workers * pollsEach} parked polls, CreateTasks of ${tasks} twice beside a CPU hog`;
    const lost = Object.values(closed.stats.streamsLost).reduce((x, y) => x + y, 0);
    ctx.check(
      `${label}: no lease stream lost, every task done`,
      lost === 0 && (last?.stats.completed ?? 0) >= 2 * tasks,
      `${lost} streams lost ${JSON.stringify(closed.stats.streamsLost)}, ${last?.stats.completed ?? 0} completed; rounds ${rounds.map((r) => `${(r.ms / 1000).toFixed(1)} s`).join(", ")}`,
    );
    const status = rounds
      .map(
        (r, i) =>
          `round ${i + 1}: GetFleetStatus p50 ${r.statusP50.toFixed(0)} ms, max ${r.statusMax.toFixed(0)} ms`,
      )
      .join("; ");
    if (ctx.short) console.log(`note ${label}: ${status} (not checked in --short)`);
    else {
      ctx.check(
        `${label}: GetFleetStatus answers in well under a second (p50)`,
        rounds.every((r) => r.statusP50 < 1000),
        status,
      );
    }
    // RSS follows V8's heap high-water mark, which moves with when the
    // collector happens to run: in the short suite's smaller rounds that
    // noise (±50 MiB) is as large as what is measured, so it is checked in
    // the full suite only, as the timings are.
    const [r1, r2] = rounds;
    const memory = `RSS ${mib(parked)} MiB parked, ${mib(r1?.rss ?? 0)} after round 1, ${mib(r2?.rss ?? 0)} after round 2, ${mib(afterClose)} once every stream and poll closed`;
    const rssName = `${label}: a second identical round does not grow RSS further (≤ 32 MiB)`;
    if (ctx.short) console.log(`note ${rssName}: ${memory} (not checked in --short)`);
    else {
      ctx.check(
        rssName,
        r1 !== undefined && r2 !== undefined && r2.rss - r1.rss <= 32 * 2 ** 20,
        memory,
      );
    }
  } finally {
    hog.kill("SIGKILL");
    fleet.kill("SIGKILL");
    await co.stop().catch(() => {});
    await p.drop();
  }
}

/** Mounts a 1 MiB tmpfs where it may (root, Linux); undefined elsewhere. */
function smallDisk(): string | undefined {
  if (process.platform !== "linux" || process.getuid?.() !== 0) return undefined;
  const dir = mkdtempSync(join(tmpdir(), "meshwork-full-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", dir], { stdio: "ignore" });
    return dir;
  } catch {
    rmSync(dir, { recursive: true, force: true });
    return undefined;
  }
}

/** Uploads onto a full disk. */
export async function diskFull(ctx: HostileContext): Promise<void> {
  const disk = smallDisk();
  if (!disk) {
    console.log("skip disk-full: mounting a tmpfs needs root on Linux");
    return;
  }
  const blobDir = join(disk, "blobs");
  mkdirSync(blobDir);
  const p = await ctx.place();
  const co = await start(p.url, ["--blob-dir", blobDir]);
  try {
    const put = async (bytes: number) => {
      // An INPUT upload over RPC, and a task's artifact over the PUT byte route.
      const r = await runChild("bench/faults/upload.ts", [co.url, co.token, String(bytes)]);
      return r as { code: string; reason: string; status: number };
    };
    const big = await put(3 * 1024 * 1024);
    const small = await put(1000);
    const leftovers = readdirSync(join(blobDir, "tmp"));
    const lines = co
      .log()
      .split("\n")
      .filter((l) => l.includes("STORAGE_FULL"));
    const label = `${engineOf(p.url)}: an upload onto a full disk (1 MiB tmpfs)`;
    ctx.check(
      `${label}: resource_exhausted STORAGE_FULL (HTTP 507 on the byte route), nothing kept, one log line`,
      big.code === "resource_exhausted" &&
        big.reason === "STORAGE_FULL" &&
        big.status === 507 &&
        leftovers.length === 0 &&
        lines.length === 2,
      `RPC ${big.code}/${big.reason}, PUT ${big.status}; ${leftovers.length} temporary files left; ${lines.length} log lines (one per refusal)`,
    );
    ctx.check(`${label}: a small upload after it is stored`, small.code === "ok", small.code);
  } finally {
    await co.stop().catch(() => {});
    await p.drop();
    execFileSync("umount", [disk]);
    rmSync(disk, { recursive: true, force: true });
  }
}

/** A byte flipped in a stored blob. */
export async function corrupt(ctx: HostileContext): Promise<void> {
  const p = await ctx.place();
  const co = await start(p.url);
  try {
    const data = Buffer.from(Uint8Array.from({ length: 2_000_000 }, (_, i) => (i * 31) & 0xff));
    const sha256 = createHash("sha256").update(data).digest("hex");
    const file = join(mkdtempSync(join(tmpdir(), "meshwork-rot-")), "in.bin");
    writeFileSync(file, data);
    const cli = (args: string[]) => {
      try {
        return {
          code: 0,
          out: execFileSync(
            process.execPath,
            ["bin/meshwork.js", ...args, "--url", co.url, "--token", co.token],
            { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] },
          ),
        };
      } catch (error) {
        const e = error as { status: number; stdout: string; stderr: string };
        return { code: e.status, out: `${e.stdout}${e.stderr}` };
      }
    };
    const id = cli(["artifact", "put", file]).out.trim().split("\n")[0] ?? "";
    const blob = join(
      co.dataDir,
      "blobs",
      "sha256",
      sha256.slice(0, 2),
      sha256.slice(2, 4),
      sha256,
    );
    const bytes = readFileSync(blob);
    bytes[1_234_567] = ((bytes[1_234_567] ?? 0) + 1) % 256;
    writeFileSync(blob, bytes);
    const download = async () => {
      const res = await fetch(`${co.url}/artifacts/${id}/download`, {
        headers: { authorization: `Bearer ${co.token}` },
      });
      let got = 0;
      let cut = false;
      try {
        for await (const c of res.body as unknown as AsyncIterable<Uint8Array>) got += c.byteLength;
      } catch {
        cut = true;
      }
      return { status: res.status, got, cut };
    };
    const first = await download();
    const again = await download();
    const verify = cli(["artifact", "verify"]);
    const label = `${engineOf(p.url)}: one byte flipped in a stored 2 MB blob`;
    ctx.check(
      `${label}: never served as good (the download cut short, then refused), verify reports it`,
      first.status === 200 &&
        (first.cut || first.got < data.length) &&
        again.status === 500 &&
        verify.code === 1 &&
        verify.out.includes(sha256),
      `first download ${first.status} with ${first.got} of ${data.length} bytes${first.cut ? ", cut" : ""}; next ${again.status}; verify exit ${verify.code}`,
    );
    cli(["artifact", "put", file]);
    const repaired = await download();
    ctx.check(
      `${label}: the same bytes uploaded again repair it`,
      repaired.status === 200 &&
        repaired.got === data.length &&
        !repaired.cut &&
        cli(["artifact", "verify"]).code === 0,
      `${repaired.status}, ${repaired.got} bytes`,
    );
  } finally {
    await co.stop().catch(() => {});
    await p.drop();
  }
}
