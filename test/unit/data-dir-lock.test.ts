import { execFile } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";

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
            execFile(
              "node",
              ["--import", "tsx", "test/support/lock-child.ts", dir, startAt],
              { timeout: 60_000 },
              (_error, stdout) => resolve(stdout.trim()),
            );
          }),
      ),
    );
    expect(
      outcomes.filter((o) => o === "locked"),
      outcomes.join(","),
    ).toHaveLength(1);
    expect(outcomes.filter((o) => o === "refused")).toHaveLength(7);
  });
});
