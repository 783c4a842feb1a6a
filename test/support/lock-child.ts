// Takes the data-dir lock of argv[2] at the instant argv[3] (ms since the
// epoch, so that several children race), says whether it got it, and holds
// it until killed (test/unit/data-dir-lock.test.ts).
import { lockDataDir } from "../../src/data-dir-lock.js";

const startAt = Number(process.argv[3] ?? 0);
while (Date.now() < startAt) {
  // spin
}
try {
  lockDataDir(process.argv[2] ?? "");
  process.stdout.write("locked\n");
  setInterval(() => {}, 60_000);
} catch {
  process.stdout.write("refused\n");
}
