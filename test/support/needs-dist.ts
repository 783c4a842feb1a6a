import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

/**
 * What runs the build: a file naming `bin/meshwork.js` (which runs dist/) or
 * `dist/` itself, as the spawning helpers (support/serve.ts) and the package
 * tests do.
 */
const runsTheBuild = /bin\/meshwork\.js|(?<![\w-])dist\//;

/**
 * The test files outside test/e2e/ that run the built program: those that,
 * themselves or through a test/ module they import (followed to the end),
 * name bin/meshwork.js or dist/. Paths relative to `root`, sorted. test/e2e/
 * is left out: every file there runs with the build (vitest.config.ts).
 */
export function outsideE2eNeedingDist(root: string): string[] {
  const testDir = resolve(root, "test");
  const verdicts = new Map<string, boolean>();
  const needs = (file: string): boolean => {
    const known = verdicts.get(file);
    if (known !== undefined) return known;
    verdicts.set(file, false); // an import cycle adds nothing
    const text = readFileSync(file, "utf8");
    let verdict = runsTheBuild.test(text);
    for (const m of text.matchAll(/(?:\bfrom\s+|\bimport\s*\(\s*)"(\.[^"]+)"/g)) {
      if (verdict) break;
      const target = resolve(dirname(file), (m[1] ?? "").replace(/\.js$/, ".ts"));
      if (target.startsWith(`${testDir}/`) && existsSync(target)) verdict = needs(target);
    }
    verdicts.set(file, verdict);
    return verdict;
  };
  return testFiles(testDir)
    .filter((f) => !f.startsWith(join(testDir, "e2e/")) && needs(f))
    .map((f) => relative(root, f))
    .sort();
}

function testFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return testFiles(path);
    return e.name.endsWith(".test.ts") ? [path] : [];
  });
}
