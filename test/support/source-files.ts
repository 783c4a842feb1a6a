import { readdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The src/ folder of this checkout. */
export const src = resolve(dirname(fileURLToPath(import.meta.url)), "../../src");

/** Every .ts file below `dir`, for the tests that read the source (layers, driver quirks). */
export function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(path);
    return e.name.endsWith(".ts") ? [path] : [];
  });
}
