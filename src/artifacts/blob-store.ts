import { randomUUID } from "node:crypto";
import { createReadStream, mkdirSync, rmSync } from "node:fs";
import { mkdir, open, readdir, rename, rm, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { Readable } from "node:stream";
import { storageFailure } from "./blob-unavailable.js";
import { countingHash } from "./counting-hash.js";

/** Bytes hashed into a temporary place, not yet in the content-addressed store. */
export interface StagedBlob {
  sha256: string;
  size: number;
  /**
   * Makes the bytes durable under their hash (for files: fsync, rename,
   * fsync of the directory). Bytes stored under the hash already are kept
   * as they are, unless `replace` (they were found corrupt: these good
   * bytes take their place).
   */
  commit(options?: { replace?: boolean }): Promise<void>;
  /** Removes the temporary copy. */
  discard(): Promise<void>;
}

/**
 * Where artifact bytes live, addressed by their SHA-256: local files
 * (`createFileBlobStore`), the PostgreSQL database or S3-compatible object
 * storage (`createBlobStore` picks one from `--blob-store`).
 */
export interface BlobStore {
  /**
   * Streams `source` into a temporary file while hashing it. Refuses with
   * `resource_exhausted` as soon as more than `maxBytes` arrive; on any
   * error the temporary file is removed.
   */
  stage(source: AsyncIterable<Uint8Array>, maxBytes: number): Promise<StagedBlob>;
  /**
   * The bytes of a committed blob, `start`..`end` inclusive when given.
   * Returned at once; a failure to read is an error on the stream.
   */
  read(sha256: string, range?: { start: number; end: number }): Readable;
  /** Whether a committed blob exists. */
  has(sha256: string): Promise<boolean>;
  /**
   * Deletes a committed blob; a missing one is no error. Only retention
   * calls it (tasks/retention.ts), once no artifact row names the bytes.
   */
  remove?(sha256: string): Promise<void>;
  /**
   * Removes what uploads abandoned by a crash left in a store that replicas
   * share (the app runs it now and then); returns how many were removed. A
   * store that clears its leftovers when it opens has none.
   */
  removeAbandoned?(): Promise<number>;
  /** Releases what the store holds open (an S3 client's sockets): the server calls it last when it stops. */
  close?(): Promise<void>;
}

/**
 * Content-addressed files under `root`: `sha256/ab/cd/<hex>`, written through
 * `tmp/` (cleared at start-up, so a crash leaves nothing half-written in the
 * tree, and swept of files an hour old while running: removeAbandoned). The
 * same bytes stored twice are kept once.
 */
export function createFileBlobStore(
  root: string,
  options: { abandonedAfterMs?: number } = {},
): BlobStore {
  const abandonedAfterMs = options.abandonedAfterMs ?? 60 * 60 * 1000;
  const tmp = join(root, "tmp");
  // Synchronous, once at start-up: whatever a crash left half-written goes.
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  const pathOf = (sha: string) => join(root, "sha256", sha.slice(0, 2), sha.slice(2, 4), sha);

  async function fsyncDir(dir: string): Promise<void> {
    const fh = await open(dir, "r");
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
  }

  return {
    async stage(source, maxBytes) {
      const tempPath = join(tmp, randomUUID());
      const fh = await open(tempPath, "wx", 0o600).catch((error: unknown) => {
        throw storageFailure("creating a temporary file", error);
      });
      const bytes = countingHash(source, maxBytes);
      const writeAll = async (chunk: Uint8Array) => {
        let written = 0;
        try {
          while (written < chunk.byteLength) {
            const { bytesWritten } = await fh.write(chunk, written, chunk.byteLength - written);
            written += bytesWritten;
          }
        } catch (error) {
          throw storageFailure("writing", error);
        }
      };
      // One write in flight while the next chunk is received and hashed:
      // hashing (this thread) and writing (the thread pool) overlap.
      let writing: Promise<void> = Promise.resolve();
      try {
        for await (const chunk of bytes) {
          await writing;
          writing = writeAll(chunk);
          // Handled here, awaited on the next turn: a failed write must not
          // surface as an unhandled rejection while the next chunk arrives.
          writing.catch(() => {});
        }
        await writing;
        await fh.sync().catch((error: unknown) => {
          throw storageFailure("syncing", error);
        });
      } catch (error) {
        await writing.catch(() => {});
        await fh.close().catch(() => {});
        await rm(tempPath, { force: true });
        throw error;
      }
      await fh.close();
      const sha256 = bytes.sha256();
      return {
        sha256,
        size: bytes.size,
        async commit(options = {}) {
          const target = pathOf(sha256);
          try {
            if (!options.replace && (await exists(target))) {
              await rm(tempPath, { force: true });
              return;
            }
            await mkdir(dirname(target), { recursive: true });
            await rename(tempPath, target);
            await fsyncDir(dirname(target));
          } catch (error) {
            throw storageFailure("storing", error);
          }
        },
        discard: () => rm(tempPath, { force: true }),
      };
    },
    read(sha256, range) {
      return createReadStream(pathOf(sha256), range ? { start: range.start, end: range.end } : {});
    },
    has: (sha256) => exists(pathOf(sha256)),
    remove: (sha256) => rm(pathOf(sha256), { force: true }),
    /**
     * Temporary files untouched for an hour: an upload a crash of another
     * process on the same directory abandoned (a live one writes as bytes
     * come, and a body that stops is ended within the body timeout).
     */
    async removeAbandoned() {
      const cutoff = Date.now() - abandonedAfterMs;
      let removed = 0;
      for (const name of await readdir(tmp).catch(() => [] as string[])) {
        const path = join(tmp, name);
        const modified = await stat(path).then(
          (st) => st.mtimeMs,
          () => Number.POSITIVE_INFINITY,
        );
        if (modified > cutoff) continue;
        await rm(path, { force: true });
        removed++;
      }
      return removed;
    },
  };
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/** Files left in `tmp/` (for tests: nothing should remain after any upload). */
export async function leftovers(root: string): Promise<string[]> {
  try {
    return await readdir(join(root, "tmp"));
  } catch {
    return [];
  }
}
