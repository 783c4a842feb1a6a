import { execFileSync } from "node:child_process";
import type { TestProject } from "vitest/node";

declare module "vitest" {
  interface ProvidedContext {
    /** True in the files of a project whose global setup built dist/ (vitest.config.ts). */
    distBuilt: boolean;
  }
}

/**
 * Vitest global setup of the "built" project (vitest.config.ts): builds
 * dist/ once before any test file runs, so the tests that spawn
 * `node bin/meshwork.js` run the code under test, never a stale build.
 */
export default function setup(project: TestProject): void {
  execFileSync("npm", ["run", "--silent", "build"], { stdio: "inherit" });
  project.provide("distBuilt", true);
}
