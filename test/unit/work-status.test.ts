import { describe, expect, it } from "vitest";
import type { Io } from "../../src/cli/args.js";
import { createStatus } from "../../src/cli/work.js";
import type { WorkerTask } from "../../src/sdk/worker.js";

// What `meshwork work` shows: on a terminal one status line redrawn in place
// (carriage return, erase line), otherwise one plain log line per task start
// and end that a log collector can keep.

function capture(): { io: Io; out: () => string } {
  let text = "";
  const sink = {
    write(chunk: string) {
      text += chunk;
      return true;
    },
  } as unknown as NodeJS.WritableStream;
  return { io: { out: sink, err: sink }, out: () => text };
}

const task = (id: string, attempt = 1) => ({ id, attempt }) as WorkerTask;

describe("meshwork work's status", () => {
  it("on a terminal, redraws one line: done and failed counts, the running tasks, the elapsed time", () => {
    const { io, out } = capture();
    const status = createStatus(io, true);
    status.start(task("t-1"));
    status.start(task("t-2"));
    expect(out().split("\r\x1b[2K").at(-1)).toMatch(
      /^done 0 {2}failed 0 {2}running t-1, t-2 {2}0m0\ds$/,
    );
    status.end(task("t-1"), "done", true);
    status.end(task("t-2"), "failed", false);
    for (const id of ["t-3", "t-4", "t-5", "t-6"]) status.start(task(id));
    expect(out().split("\r\x1b[2K").at(-1)).toMatch(
      /^done 1 {2}failed 1 {2}running t-3, t-4, t-5 \+1 {2}0m0\ds$/,
    );
    for (const id of ["t-3", "t-4", "t-5", "t-6"]) status.end(task(id), "done", true);
    status.close();
    // Ends with the final counts on a line of its own; no line per task.
    const last = out().split("\r\x1b[2K").at(-1);
    expect(last).toMatch(/^done 5 {2}failed 1 {2}idle {2}0m0\ds\n$/);
    expect(out()).not.toContain("start t-1");
  });

  it("elsewhere, writes one timestamped line per start and end, and no escape sequences", () => {
    const { io, out } = capture();
    const status = createStatus(io, false);
    status.start(task("t-1", 2));
    status.end(task("t-1"), "failed", false);
    status.close();
    const lines = out().trimEnd().split("\n");
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatch(/^\d{4}-\d\d-\d\dT\S+Z start t-1 \(attempt 2\)$/);
    expect(lines[1]).toMatch(/^\d{4}-\d\d-\d\dT\S+Z failed t-1$/);
    expect(out()).not.toContain("\x1b");
  });
});
