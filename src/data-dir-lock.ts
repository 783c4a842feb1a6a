import {
  linkSync,
  mkdirSync,
  readFileSync,
  rmdirSync,
  statSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";

/** A start-up failure told in one line (the command prints it and exits 1). */
export class StartupError extends Error {
  override readonly name = "StartupError";
}

/** Whether a process with this pid runs (EPERM: it does, under another user). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as { code?: string }).code === "EPERM";
  }
}

/**
 * Takes `<data dir>/meshwork.lock` for this process before anything else in
 * the data directory is touched: a second coordinator on the same data
 * directory (embedded database, blobs, admin token) would corrupt or lose
 * the first one's work, so it refuses to start. The file holds the
 * holder's pid; a lock left by a process that is gone is taken over.
 * Returns the release function (removes the file if it is still ours).
 */
export function lockDataDir(dataDir: string): () => void {
  const path = join(dataDir, "meshwork.lock");
  try {
    mkdirSync(dataDir, { recursive: true });
  } catch (error) {
    if (
      (error as { code?: string }).code === "EEXIST" ||
      (error as { code?: string }).code === "ENOTDIR"
    ) {
      throw new StartupError(`--data-dir ${dataDir} is a file, not a directory`);
    }
    throw new StartupError(
      `cannot create the data directory ${dataDir}: ${(error as Error).message.split("\n")[0]}`,
    );
  }
  for (let attempt = 0; attempt < 20; attempt++) {
    try {
      // Made whole, then linked into place: a lock file is never seen
      // empty (an empty one would look damaged, and be taken over).
      const own = `${path}.${process.pid}`;
      writeFileSync(own, `${process.pid}\n`, { mode: 0o600 });
      try {
        linkSync(own, path);
      } finally {
        unlinkSync(own);
      }
      return () => {
        try {
          if (readFileSync(path, "utf8").trim() === String(process.pid)) unlinkSync(path);
        } catch {
          // Gone already: nothing to release.
        }
      };
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code !== "EEXIST") {
        throw new StartupError(
          `cannot lock the data directory ${dataDir} (${code ?? "error"}): check that it is a writable directory`,
        );
      }
    }
    let holder = Number.NaN;
    try {
      holder = Number.parseInt(readFileSync(path, "utf8").trim(), 10);
    } catch {
      // Removed meanwhile, or unreadable: try again.
    }
    if (Number.isInteger(holder) && holder > 0 && holder !== process.pid && alive(holder)) {
      throw new StartupError(
        `the data directory ${dataDir} is in use by another meshwork process (pid ${holder}, see ${path}): stop it, or give this one another --data-dir`,
      );
    }
    // A stale lock (its process is gone, or the file is damaged): take it
    // over, one process at a time. Whoever makes the guard directory looks
    // again and removes the lock only if it is still the stale one; without
    // the guard, two starting processes could each remove the other's
    // fresh lock and both run.
    takeOver(path, holder);
  }
  throw new StartupError(`cannot lock the data directory ${dataDir}: ${path} keeps changing`);
}

/** Removes the lock at `path` if it still names `stale`, under an exclusive guard. */
function takeOver(path: string, stale: number): void {
  const guard = `${path}.takeover`;
  try {
    mkdirSync(guard);
  } catch {
    // Another process is taking over: wait a little and look again. A guard
    // left by a process that died mid-takeover is removed after 10 s.
    try {
      if (Date.now() - statSync(guard).mtimeMs > 10_000) rmdirSync(guard);
    } catch {
      // Gone already.
    }
    sleepSync(50);
    return;
  }
  try {
    let now = Number.NaN;
    try {
      now = Number.parseInt(readFileSync(path, "utf8").trim(), 10);
    } catch {
      return; // removed meanwhile: the next attempt creates it
    }
    if (now === stale || Number.isNaN(now)) unlinkSync(path);
  } finally {
    rmdirSync(guard);
  }
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}
