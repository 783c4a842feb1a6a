import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

/**
 * Builds the web dashboard into dist/web/: the TypeScript (with the
 * generated Connect clients from gen/) bundled into one script, the
 * stylesheet, both named by content hash under assets/, and index.html
 * pointing at them. Run by `npm run build` after tsc.
 */
const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const out = join(root, "dist", "web");
mkdirSync(join(out, "assets"), { recursive: true });

const result = await build({
  entryPoints: [join(root, "web", "src", "main.ts"), join(root, "web", "style.css")],
  outdir: join(out, "assets"),
  entryNames: "[name]-[hash]",
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2022",
  platform: "browser",
  metafile: true,
  legalComments: "none",
  logLevel: "warning",
});

const outputs = Object.entries(result.metafile.outputs);
const named = (entry: string) => {
  const found = outputs.find(([, o]) => o.entryPoint?.endsWith(entry));
  if (!found) throw new Error(`esbuild wrote no output for ${entry}`);
  return `/assets/${basename(found[0])}`;
};
const html = readFileSync(join(root, "web", "index.html"), "utf8")
  .replace("%SCRIPT%", named("main.ts"))
  .replace("%STYLE%", named("style.css"));
writeFileSync(join(out, "index.html"), html);
