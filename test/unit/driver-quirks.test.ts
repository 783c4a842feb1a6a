import { readFileSync } from "node:fs";
import { relative } from "node:path";
import { describe, expect, it } from "vitest";
import { sourceFiles, src } from "../support/source-files.js";

// The two drivers differ in what a value looks like: PGlite gives a computed
// boolean as `true` where postgres.js may give PostgreSQL's text form "t", a
// bigint or numeric count comes as a string from one and a number from the
// other, and raw rows come as an array or as `{ rows }`. src/db/values.ts
// (asBoolean, asNumber, rowsOf) is the one place that knows; a store that
// compares with "t" itself, or casts a driver value through `unknown` to the
// type it hopes for, works on the driver its author tried and breaks on the
// other — and a `as unknown as` cast silences exactly the check that would
// have said so. So outside src/db/ neither may appear.

const quirks = [/===\s*"t"/, /===\s*'t'/, /\bas\s+unknown\s+as\b/];

/** `file:line: text` of each line outside src/db/ that handles a driver quirk itself. */
function quirksOutsideDb(): string[] {
  const found: string[] = [];
  for (const file of sourceFiles(src)) {
    const path = relative(src, file);
    if (path.startsWith("db/")) continue;
    readFileSync(file, "utf8")
      .split("\n")
      .forEach((line, i) => {
        if (quirks.some((q) => q.test(line))) found.push(`src/${path}:${i + 1}: ${line.trim()}`);
      });
  }
  return found;
}

describe("driver quirks", () => {
  it('are handled only in src/db/: no `=== "t"` and no `as unknown as` elsewhere', () => {
    expect(quirksOutsideDb()).toEqual([]);
  });
});
