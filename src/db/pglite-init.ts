import { execFile } from "node:child_process";
import { existsSync, readdirSync, renameSync, rmdirSync, rmSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, dirname, join } from "node:path";

/**
 * PostgreSQL's `shared_buffers` in PGlite. Its buffer pool lives in the
 * WebAssembly heap and is touched when the server starts, so all of it is
 * resident: at PostgreSQL's default (128MB) an idle PGlite holds ~300 MiB,
 * at 16MB ~160 MiB (bench/RESULTS.md, Memory). The data files stay in the
 * operating system's page cache either way; meshwork's tables are small.
 */
export const pgliteSharedBuffers = "16MB";

/** The options of every PGlite the coordinator opens. */
export function pgliteOptions(defaultStartParams: readonly string[]): {
  startParams: string[];
} {
  return {
    startParams: [...defaultStartParams, "-c", `shared_buffers=${pgliteSharedBuffers}`],
  };
}

// Run by `node -e` in the child: creates the database in the directory and
// closes it. On failure it prints the first line of the error and exits 1.
const childScript = `
const [pglite, location, sharedBuffers] = process.argv.slice(1);
const { PGlite } = require(pglite);
const startParams = [...PGlite.defaultStartParams, "-c", "shared_buffers=" + sharedBuffers];
PGlite.create(location, { startParams })
  .then((db) => db.close())
  .then(
    () => process.exit(0),
    (e) => {
      process.stderr.write(String((e && e.message) || e).split("\\n")[0]);
      process.exit(1);
    },
  );
`;

/**
 * Makes a new PGlite data directory (initdb) in a short-lived child process,
 * when `location` holds none yet. Done in the coordinator's own process,
 * initdb runs a second PGlite and the initdb program beside the one that
 * stays: their WebAssembly memories (~430 MiB) are freed only by full
 * garbage collections an idle process may never run, and their compiled
 * code stays. The coordinator then opens the directory as on any restart.
 */
export async function initPgliteDataDir(location: string): Promise<void> {
  if (existsSync(join(location, "PG_VERSION"))) return;
  // Made beside it and renamed into place once whole: a child killed midway
  // (initdb writes PG_VERSION early) leaves only a `.init-` directory, which
  // the next start removes, never a half-made database it would open.
  if (existsSync(location)) {
    const isEmptyDir = statSync(location).isDirectory() && readdirSync(location).length === 0;
    if (!isEmptyDir) {
      throw new Error(`initdb failed: ${location} is not an empty directory and holds no database`);
    }
  }
  const parent = dirname(location);
  const prefix = `${basename(location)}.init-`;
  for (const name of readdirSync(parent)) {
    if (name.startsWith(prefix)) rmSync(join(parent, name), { recursive: true, force: true });
  }
  const staging = join(parent, `${prefix}${process.pid}`);
  const pglite = createRequire(import.meta.url).resolve("@electric-sql/pglite");
  await new Promise<void>((resolve, reject) => {
    execFile(
      process.execPath,
      ["-e", childScript, pglite, staging, pgliteSharedBuffers],
      { maxBuffer: 1024 * 1024 },
      (error, _stdout, stderr) => {
        if (!error) return resolve();
        const why = stderr.trim().split("\n")[0] || error.message.split("\n")[0];
        reject(new Error(`initdb failed: ${why}`));
      },
    );
  }).catch((error: unknown) => {
    rmSync(staging, { recursive: true, force: true });
    throw error;
  });
  // An empty directory made by the caller gives way; one with anything in
  // it makes the rename fail rather than be replaced.
  if (existsSync(location)) rmdirSync(location);
  renameSync(staging, location);
}
