import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) c.kill("SIGKILL");
});

describe("the data-directory lock", () => {
  it("lets exactly one of eight processes take over a stale lock at once", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-lock-race-"));
    // A pid that no process has: the lock is stale.
    writeFileSync(join(dir, "meshwork.lock"), "2147483646\n");
    const startAt = String(Date.now() + 8000);
    const outcomes = await Promise.all(
      Array.from(
        { length: 8 },
        () =>
          new Promise<string>((resolve) => {
            const child = spawn("node", [
              "--import",
              "tsx",
              "test/support/lock-child.ts",
              dir,
              startAt,
            ]);
            children.push(child);
            let out = "";
            child.stdout.on("data", (d: Buffer) => {
              out += d.toString();
              if (out.includes("\n")) resolve(out.trim());
            });
            child.on("exit", () => resolve(out.trim() || "exited"));
          }),
      ),
    );
    // The winner holds the lock until the end: a late starter is refused too.
    expect(
      outcomes.filter((o) => o === "locked"),
      outcomes.join(","),
    ).toHaveLength(1);
    expect(outcomes.filter((o) => o === "refused")).toHaveLength(7);
  });
});
