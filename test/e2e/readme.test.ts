import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { useListeningServer } from "../support/server.js";

const run = promisify(execFile);
const readme = readFileSync(new URL("../../README.md", import.meta.url), "utf8");

/** The fenced sh block between the two markers. */
function block(name: string): string {
  const m = new RegExp(
    `<!-- ${name}:start -->\\s*\`\`\`sh\\n([\\s\\S]*?)\`\`\`\\s*<!-- ${name}:end -->`,
  ).exec(readme);
  if (!m?.[1]) throw new Error(`README has no ${name} block`);
  return m[1];
}

// Auth on, as `npm start` runs: the walk-throughs pass the admin token.
const server = useListeningServer({ auth: "on" });
const env = () => ({ ...process.env, MW: server.url, MESHWORK_TOKEN: server.adminToken });

describe("README", () => {
  it("runs the curl walk-through as written, ending with the task SUCCEEDED", async () => {
    const { stdout } = await run("bash", ["-euo", "pipefail", "-c", block("walkthrough")], {
      env: env(),
    });
    const lines = stdout.trim().split("\n");
    expect(JSON.parse(lines[0] ?? "").task.correlationId).toBe("readme-demo");
    const claim = JSON.parse(lines[1] ?? "");
    expect(claim.claims).toHaveLength(1);
    // The cap the README says the answer shows: default 1, none left.
    expect(claim).toMatchObject({ freeSlots: 0, maxConcurrency: 1 });
    expect(JSON.parse(lines[lines.length - 1] ?? "").task).toMatchObject({
      state: "TASK_STATE_SUCCEEDED",
      resultSummary: "20 hits",
      progress: { completedSteps: 1, message: "scoring" },
    });
  });

  it("runs the bytes walk-through as written: input verified, output uploaded, result served", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-readme-"));
    const { stdout } = await run("bash", ["-euo", "pipefail", "-c", block("bytes")], {
      env: env(),
      cwd: dir,
    });
    const lines = stdout.trim().split("\n");
    expect(lines[0]).toBe("input.txt: OK");
    expect(JSON.parse(lines[1] ?? "")).toMatchObject({ size_bytes: expect.any(Number) });
    expect(lines[2]).toBe("TASK_STATE_SUCCEEDED");
    expect(lines.slice(3).map((l) => l.trim())).toEqual(["2 be", "1 not", "1 or", "2 to"]);
  });

  it("runs the push walk-through as written: scheduled, started, extended, completed", async () => {
    const { stdout } = await run("bash", ["-euo", "pipefail", "-c", block("push")], {
      env: env(),
    });
    const lines = stdout.trim().split("\n");
    expect(lines[0]).toBe("http://worker-01.lan:8080/");
    expect(lines[1]).toBe("TASK_STATE_RUNNING");
    expect(Date.parse(lines[2] ?? "") - Date.now()).toBeGreaterThan(3_000_000);
    expect(lines[3]).toBe("TASK_STATE_SUCCEEDED");
  });

  it("runs the scheduling walk-through as written: two of three fit, the third says why it waits", async () => {
    const { stdout } = await run("bash", ["-euo", "pipefail", "-c", block("scheduling")], {
      env: env(),
    });
    const [claimed, kinds] = stdout.trim().split("\n");
    expect(claimed).toBe("2");
    expect(kinds?.split(" ")).toEqual(
      expect.arrayContaining(["WAIT_KIND_CONCURRENCY_LIMIT", "WAIT_KIND_NO_CAPACITY"]),
    );
  });

  it("runs the workflows walk-through as written: a dependent waits, then runs; a result value; a schedule", async () => {
    const { stdout } = await run("bash", ["-euo", "pipefail", "-c", block("workflows")], {
      env: env(),
    });
    const [kind, claimed, hits, next] = stdout.trim().split("\n");
    expect(kind).toBe("WAIT_KIND_DEPENDENCIES");
    expect(claimed).toBe("true 600");
    expect(hits).toBe("3");
    // 02:00 in Paris is 01:00 or 00:00 UTC.
    expect(next).toMatch(/^\d{4}-\d{2}-\d{2}T0[01]:00:00(\.000)?Z$/);
  });

  it("runs the worker REST walk-through as written: registered, claimed, renewed, verified, completed, then 204", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-readme-"));
    const { stdout } = await run("bash", ["-euo", "pipefail", "-c", block("worker-rest")], {
      env: env(),
      cwd: dir,
    });
    const lines = stdout.trim().split("\n");
    expect(lines[0]).toBe("20");
    expect(JSON.parse(lines[1] ?? "")).toEqual({
      lease_expires_at: expect.stringMatching(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/),
      cancel_requested: false,
    });
    expect(lines[2]).toBe("input.smi: OK");
    expect(JSON.parse(lines[3] ?? "")).toMatchObject({ attempt: 1, state: "succeeded" });
    expect(lines[4]).toBe("204");
  });

  it("runs the director REST walk-through as written: node, task, placement, reports, knowledge", async () => {
    const { stdout } = await run("bash", ["-euo", "pipefail", "-c", block("director-rest")], {
      env: env(),
    });
    expect(stdout.trim().split("\n")).toEqual([
      "gpu-07",
      "http://gpu-07.lan:8080/",
      "Running",
      "gpu-07",
      "Succeeded",
      "batch-7",
      JSON.stringify({ inserted: 1, updated: 0, unchanged: 0, rejected: 0, rejections: [] }),
      "3",
    ]);
  });

  it("lists methods with buf curl through reflection", async () => {
    const { stdout } = await run("npx", [
      "buf",
      "curl",
      "--protocol",
      "grpc",
      "--http2-prior-knowledge",
      "--reflect-header",
      `authorization: Bearer ${server.adminToken}`,
      "--list-methods",
      server.url,
    ]);
    expect(stdout).toContain("meshwork.v1.LeaseService/ClaimTasks");
    expect(stdout).toContain("grpc.health.v1.Health/Check");
  });
});
