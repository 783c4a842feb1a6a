import { fileURLToPath } from "node:url";
import { configDefaults, defineConfig } from "vitest/config";
import { outsideE2eNeedingDist } from "./test/support/needs-dist.js";

// Two projects, so that a run builds dist/ only when it runs the built program.
//  - "built": test/e2e/ (the program as shipped: the CLI, the package, the
//    examples) and any other file that, itself or through a test/ module it
//    imports, names bin/meshwork.js or dist/ (test/support/needs-dist.ts;
//    today test/postgres/connection-storm and log-secrets, through
//    support/serve.ts). Its global setup (test/support/build.ts) builds dist/
//    first.
//  - "source": everything else (test/unit, contract, rpc, the rest of
//    test/postgres): it imports src/ directly and needs no build.
// Vitest runs a project's global setup only when the run selected one of its
// files, once per run, before any file of either project starts: so
// `npx vitest run test/contract/x.test.ts` builds nothing, while `npm test`
// (and every run in .ci/run) builds exactly once, first, as before. Projects
// rather than a setup that inspects the selected files: Vitest itself decides
// which project a file belongs to, for file filters, --project and watch mode
// alike. A file that spawns the CLI through support/serve.ts from "source"
// (a missed case) fails with a message saying so, never on a stale dist/.
//
// DATABASE_URL set: every suite runs on PostgreSQL (each test file in a fresh
// database created from that URL and dropped after). Unset: embedded PGlite.
const needDist = [
  "test/e2e/**/*.test.ts",
  ...outsideE2eNeedingDist(fileURLToPath(new URL(".", import.meta.url))),
];

export default defineConfig({
  test: {
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    projects: [
      {
        extends: true,
        test: {
          name: "built",
          include: needDist,
          globalSetup: ["test/support/build.ts"],
        },
      },
      {
        extends: true,
        test: {
          name: "source",
          include: ["test/**/*.test.ts"],
          exclude: [...configDefaults.exclude, ...needDist],
        },
      },
    ],
  },
});
