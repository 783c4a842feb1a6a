// Takes the data-dir lock of argv[2] and holds it for 12 s (test/unit/data-dir-lock.test.ts).
import { lockDataDir } from "../../src/data-dir-lock.js";

// All children try at the same instant (argv[3], ms since the epoch), so
// that their takeovers race.
const startAt = Number(process.argv[3] ?? 0);
while (Date.now() < startAt) {
  // spin
}
try {
  lockDataDir(process.argv[2] ?? "");
  process.stdout.write("locked\n");
  setTimeout(() => {}, 12_000);
} catch {
  process.stdout.write("refused\n");
}
