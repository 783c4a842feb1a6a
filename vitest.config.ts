import { defineConfig } from "vitest/config";

// DATABASE_URL set: every suite runs on PostgreSQL (each test file in a fresh
// database created from that URL and dropped after). Unset: embedded PGlite.
export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Builds dist/ first: tests spawn bin/meshwork.js, which runs the build.
    globalSetup: ["test/support/build.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
  },
});
