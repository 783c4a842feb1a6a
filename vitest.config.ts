import { defineConfig } from "vitest/config";

// DATABASE_URL set: every suite runs on PostgreSQL (each test file in a fresh
// database created from that URL and dropped after). Unset: embedded PGlite.
export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
  },
});
