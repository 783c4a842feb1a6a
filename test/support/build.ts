import { execFileSync } from "node:child_process";

/**
 * Vitest global setup: builds dist/ once before any test file runs, so the
 * tests that spawn `node bin/meshwork.js` run the code under test, never a
 * stale build.
 */
export default function setup(): void {
  execFileSync("npm", ["run", "--silent", "build"], { stdio: "inherit" });
}
