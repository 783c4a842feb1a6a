import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KnowledgeService } from "../../gen/meshwork/v1/knowledge_pb.js";
import { transportFor } from "../../src/cli/connect.js";
import { syncKnowledge } from "../../src/cli/knowledge.js";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { appOn } from "../support/harness.js";

const run = promisify(execFile);
const dbs: TestDatabase[] = [];
const servers: RunningServer[] = [];
/** Each coordinator's own admin token (auth on, as in production). */
const tokens: string[] = [];

beforeAll(async () => {
  for (let i = 0; i < 2; i++) {
    const db = await createTestDatabase();
    dbs.push(db);
    const app = appOn(db.database, { auth: "on" });
    tokens.push((await app.tokens.create(`admin-${i}`, "admin")).secret);
    servers.push(await listen(app, "127.0.0.1:0"));
  }
});
afterAll(async () => {
  for (const s of servers) await s.close();
  for (const d of dbs) await d.drop();
});

const endpoint = (i: number) => ({ url: servers[i]?.url ?? "", token: tokens[i] ?? "" });
const client = (i: number) => createClient(KnowledgeService, transportFor(endpoint(i)));

describe("knowledge sync between two live coordinators on two databases", () => {
  it("copies what one has to the other, once, and a second sync changes nothing", async () => {
    const [a, b] = [client(0), client(1)];
    await a.putEntry({ kind: "adaptation", key: "lr", value: { rate: 0.1 } });
    await a.putEntry({ kind: "pattern", key: "p1", value: { steps: [1, 2] } });
    await b.putEntry({ kind: "pattern", key: "p2", value: {} });
    const first = await syncKnowledge(endpoint(0), endpoint(1));
    expect(first).toEqual({ inserted: 2, updated: 0, unchanged: 0, rejected: 0, reasons: [] });
    const again = await syncKnowledge(endpoint(0), endpoint(1));
    expect(again).toEqual({ inserted: 0, updated: 0, unchanged: 2, rejected: 0, reasons: [] });
    const got = await b.getEntry({ kind: "adaptation", key: "lr" });
    const origin = (await a.getEntry({ kind: "adaptation", key: "lr" })).entry?.origin;
    expect(got.entry).toMatchObject({ value: { rate: 0.1 }, version: 1n, origin });
    expect((await b.listEntries({})).entries.map((e) => e.key).sort()).toEqual(["lr", "p1", "p2"]);
  });

  it("exports and imports through the meshwork CLI", async () => {
    await client(0).putEntry({ kind: "cli", key: "x", value: { n: 1 } });
    const exported = await run("node", [
      "bin/meshwork.js",
      "knowledge",
      "export",
      "--url",
      servers[0]?.url ?? "",
      "--token",
      tokens[0] ?? "",
      "--kind",
      "cli",
    ]);
    const lines = exported.stdout.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0] ?? "")).toMatchObject({ kind: "cli", key: "x", value: { n: 1 } });
    const child = execFile("node", [
      "bin/meshwork.js",
      "knowledge",
      "import",
      "--url",
      servers[1]?.url ?? "",
      "--token",
      tokens[1] ?? "",
    ]);
    let stderr = "";
    child.stderr?.on("data", (d: Buffer) => {
      stderr += d.toString();
    });
    child.stdin?.end(
      `${exported.stdout}{not json}\n${JSON.stringify({ kind: "cli", key: "y", version: "1" })}\n`,
    );
    await new Promise((resolve) => child.on("exit", resolve));
    // Each rejected line is named, with why.
    expect(stderr).toContain("rejected line 2: not a knowledge entry in JSON");
    expect(stderr).toContain("rejected line 3 (cli/y): origin must not be empty");
    expect(stderr).toContain("inserted 1, updated 0, unchanged 0, rejected 2");
    expect((await client(1).getEntry({ kind: "cli", key: "x" })).entry?.value).toEqual({ n: 1 });
  });

  it("runs the README's knowledge example as written", async () => {
    const readme = readFileSync(new URL("../../README.md", import.meta.url), "utf8");
    const m = /<!-- knowledge:start -->\s*```sh\n([\s\S]*?)```/.exec(readme);
    const { stderr } = await run("bash", ["-euo", "pipefail", "-c", m?.[1] ?? "false"], {
      env: {
        ...process.env,
        A: servers[0]?.url ?? "",
        B: servers[1]?.url ?? "",
        A_TOKEN: tokens[0] ?? "",
        B_TOKEN: tokens[1] ?? "",
      },
    });
    const counts = stderr.split("\n").filter((l) => l.startsWith("inserted"));
    // (B already holds the entries earlier tests synced: they stay unchanged.)
    expect(counts[0]).toMatch(/^inserted 1, updated 0, unchanged \d+, rejected 0$/);
    expect(counts[1]).toMatch(/^inserted 0, updated 0, unchanged \d+, rejected 0$/);
    expect(counts[2]).toMatch(/^inserted 0, updated 0, unchanged \d+, rejected 0$/);
  });
});
