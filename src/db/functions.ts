import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/**
 * The database functions, as `CREATE OR REPLACE` files applied at every
 * start after the migrations, so that the current text of each function
 * (the claim above all) is in one file and not spread over frozen
 * migrations. Migrations keep only schema changes.
 *
 * Each file lives with the feature whose rule it holds, in that folder's
 * `sql/` (the lease statements in src/leases/sql/, the task history
 * triggers' functions in src/tasks/sql/, resources, selectors and limits
 * in src/scheduling/sql/); this module only knows their
 * paths, relative to src/, and order (a function must exist before a SQL
 * function that calls it is created). It imports nothing from there.
 */
export const functionFiles = [
  "leases/sql/live-lease.sql",
  "leases/sql/token.sql",
  "scheduling/sql/resources.sql",
  "scheduling/sql/selectors.sql",
  "scheduling/sql/limits.sql",
  "leases/sql/match.sql",
  "leases/sql/grant.sql",
  "leases/sql/claim.sql",
  "leases/sql/claim-batch.sql",
  "tasks/sql/dependencies.sql",
  "tasks/sql/history.sql",
] as const;

/**
 * The version of the functions' text. Raise it with every change to a
 * file: a replica applies its functions only when its version is at least
 * the installed one, so that an older replica started beside a newer one
 * (a rolling deploy) never puts back the older text. Same version and same
 * hash: nothing to do. test/unit/db-functions.test.ts pins the hash of each
 * version, so that a file changed without a new version fails there.
 */
export const functionsVersion = 21;

const src = fileURLToPath(new URL("../", import.meta.url));

/** The functions' text, in order, and its hash. */
export function functionsText(): { files: { name: string; text: string }[]; hash: string } {
  const files = functionFiles.map((name) => ({
    name,
    text: readFileSync(`${src}${name}`, "utf8"),
  }));
  const hash = createHash("sha256");
  for (const f of files) hash.update(`${f.name}\0${f.text}\0`);
  return { files, hash: hash.digest("hex") };
}

/** The little a driver must do for applyFunctions, inside one transaction. */
export interface FunctionsTx {
  /** Runs SQL text of one or more statements, without parameters. */
  exec(text: string): Promise<void>;
  /** The installed version and hash, or undefined when none is recorded yet. */
  installed(): Promise<{ version: number; hash: string } | undefined>;
  /** Records what was applied. */
  record(version: number, hash: string): Promise<void>;
}

/** What applyFunctions did: applied the files, or left newer or identical ones in place. */
export type FunctionsOutcome = "applied" | "newer installed" | "up to date";

/**
 * Applies the functions unless the database holds a newer version, or this
 * same version with the same text. Run in one transaction, and on
 * PostgreSQL under the migrations' advisory lock: two replicas starting
 * together apply one after the other, and the second sees the first's row.
 */
export async function applyFunctions(
  tx: FunctionsTx,
  version = functionsVersion,
  text = functionsText(),
): Promise<FunctionsOutcome> {
  const installed = await tx.installed();
  if (installed && installed.version > version) return "newer installed";
  if (installed && installed.version === version && installed.hash === text.hash) {
    return "up to date";
  }
  for (const f of text.files) await tx.exec(f.text);
  await tx.record(version, text.hash);
  return "applied";
}

/** SQL of FunctionsTx, shared by both drivers (the values are ours: a number and hex digits). */
export const functionsSql = {
  installed: "select version, hash from meshwork_functions where key = 'functions'",
  record(version: number, hash: string): string {
    if (!Number.isInteger(version) || !/^[0-9a-f]+$/.test(hash)) {
      throw new Error("a functions version is an integer and its hash hex digits");
    }
    return `insert into meshwork_functions (key, version, hash) values ('functions', ${version}, '${hash}')
      on conflict (key) do update set version = excluded.version, hash = excluded.hash, applied_at = now()`;
  },
};
