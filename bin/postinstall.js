#!/usr/bin/env node
// Runs after `npm install`/`npm ci`: guards postgres.js 3.4.9 against an
// upstream crash (porsager/postgres#1154, #1208, unfixed in a release).
// A write scheduled with setImmediate can run after the connection closed,
// call `socket.write` on null and end the whole process with an uncaught
// TypeError; a connection storm (pg_terminate_backend, a failover) brings
// it on. The guard settles such a write as CONNECTION_CLOSED instead, as
// the fix proposed upstream does (porsager/postgres#1209). It edits only
// that function of the installed postgres.js, is idempotent, and never fails
// the install: when it cannot apply, `meshwork serve` still logs the error
// and keeps serving (src/main.ts).
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

const marker = "meshwork: guard against a closed socket";
const original = "  function nextWrite(fn) {\n    const x = socket.write(chunk, fn)\n";
const guarded = `  function nextWrite(fn) {
    if (!socket) { // ${marker} (porsager/postgres#1208)
      nextWriteTimer !== null && clearImmediate(nextWriteTimer)
      chunk = nextWriteTimer = null
      error(Errors.connection('CONNECTION_CLOSED', options, socket))
      return false
    }
    const x = socket.write(chunk, fn)
`;

try {
  const require = createRequire(import.meta.url);
  // Its main entry is cjs/src/index.js (package.json is not exported).
  const root = dirname(dirname(dirname(require.resolve("postgres"))));
  const { version } = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
  if (version === "3.4.9") {
    for (const file of ["src/connection.js", "cjs/src/connection.js"]) {
      const path = join(root, file);
      const text = readFileSync(path, "utf8");
      if (text.includes(marker) || !text.includes(original)) continue;
      writeFileSync(path, text.replace(original, guarded));
    }
  }
} catch {
  // Not applied: see above.
}
