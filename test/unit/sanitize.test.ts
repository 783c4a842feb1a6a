import { describe, expect, it } from "vitest";
import { sanitizeMessage } from "../../src/leases/sanitize.js";

describe("a worker's error message, as stored", () => {
  it("keeps a Python exception line and drops the frames, paths and all", () => {
    const traceback = [
      "Traceback (most recent call last):",
      '  File "/home/alice/run.py", line 12, in <module>',
      "    main()",
      '  File "/home/alice/run.py", line 9, in main',
      "    raise ValueError(f'bad input at row {row}')",
      "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
      "ValueError: bad input at row 7",
    ].join("\n");
    expect(sanitizeMessage(traceback)).toBe("ValueError: bad input at row 7");
  });

  it("keeps each exception of a chained traceback and the text before it", () => {
    const message = [
      "while loading /data/in.csv",
      "Traceback (most recent call last):",
      '  File "/srv/w.py", line 3, in load',
      "KeyError: 'row'",
      "",
      "During handling of the above exception, another exception occurred:",
      "",
      "Traceback (most recent call last):",
      '  File "/srv/w.py", line 5, in load',
      "RuntimeError: cannot load",
    ].join("\n");
    expect(sanitizeMessage(message)).toBe(
      "while loading [path] KeyError: 'row' RuntimeError: cannot load",
    );
  });

  it("keeps a JavaScript error's first line and drops its stack", () => {
    const stack = [
      "Error: ENOENT: no such file or directory, open 'frames/0001.exr'",
      "    at Object.openSync (node:fs:573:18)",
      "    at render (/home/bob/worker/index.js:20:5)",
      "    ... 4 lines matching cause stack trace ...",
    ].join("\n");
    expect(sanitizeMessage(stack)).toBe(
      "Error: ENOENT: no such file or directory, open 'frames/0001.exr'",
    );
  });

  it("masks tokens and secrets and cuts to 2 KiB on a character boundary", () => {
    expect(sanitizeMessage("auth failed token=mw_secret123 for Bearer abc")).toBe(
      "auth failed token=[redacted] for Bearer [redacted]",
    );
    const long = sanitizeMessage("é".repeat(3000));
    expect(Buffer.byteLength(long)).toBeLessThanOrEqual(2048);
    expect(long.endsWith("é...")).toBe(true);
  });
});
