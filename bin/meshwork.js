#!/usr/bin/env node
// Runs the compiled code in dist/: `npm run build` writes it (`npm start`
// and `npm pack` build first); nothing compiles TypeScript at run time.
import { existsSync } from "node:fs";

const main = new URL("../dist/src/cli/main.js", import.meta.url);
if (!existsSync(main)) {
  process.stderr.write("meshwork: dist/ is missing: run `npm run build` first\n");
  process.exit(1);
}
await import(main.href);
