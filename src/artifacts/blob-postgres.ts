import { randomUUID } from "node:crypto";
import { Readable } from "node:stream";
import { DrizzleQueryError, eq, sql } from "drizzle-orm";
import { DomainError } from "../core/errors.js";
import type { Db } from "../db/database.js";
import { blobChunks, blobs, blobUploads } from "../db/schema/index.js";
import { rowsOf } from "../db/values.js";
import type { BlobStore } from "./blob-store.js";
import { isStorageFull, storageFull } from "./blob-unavailable.js";
import { countingHash } from "./counting-hash.js";

/** Tuning of the PostgreSQL blob store; the defaults suit production. */
export interface PostgresBlobStoreOptions {
  /** Bytes per chunk row (1 MiB). A blob keeps the chunk size it was written with. */
  chunkBytes?: number;
  /**
   * How long an upload may go without a chunk before it counts as abandoned
   * by a crash and `removeAbandoned` deletes it (1 hour). Replicas share the
   * table: only the age of the last chunk tells a dead upload from another
   * replica's live one.
   */
  abandonedAfterMs?: number;
}

/** A blob store in PostgreSQL tables, with the sweep of abandoned uploads. */
export interface PostgresBlobStore extends BlobStore {
  /** Deletes uploads untouched for `abandonedAfterMs`, with their chunks; returns how many. */
  removeAbandoned(): Promise<number>;
}

/**
 * Artifact bytes in the database (`--blob-store postgres`), so that
 * replicas on one PostgreSQL share them with no other service. An upload
 * streams into `blob_chunks` under a fresh upload id, one chunk row at a
 * time while it is hashed (at most two chunks in memory); commit names it
 * in `blobs` under its SHA-256, or drops it when those bytes are there
 * already. Reads fetch one chunk per statement, only the chunks a range
 * covers. Nothing here holds a whole artifact in memory.
 */
export function createPostgresBlobStore(
  db: Db,
  options: PostgresBlobStoreOptions = {},
): PostgresBlobStore {
  const chunkBytes = options.chunkBytes ?? 1024 * 1024;
  const abandonedAfterMs = options.abandonedAfterMs ?? 60 * 60 * 1000;

  async function writeChunk(uploadId: string, seq: number, data: Uint8Array): Promise<void> {
    // Bytes travel as hex text, whichever the driver: postgres.js sends and
    // reads bytea as hex anyway, and PGlite's own conversion is a slow loop.
    // Locking the upload row (the UPDATE) orders this insert with the sweep:
    // either the sweep sees a fresh touched_at and keeps the upload, or the
    // upload is gone and nothing is inserted.
    const rows = await rowsOf<{ seq: number }>(
      db,
      sql`with upload as (
            update ${blobUploads} set touched_at = now() where id = ${uploadId} returning id
          )
          insert into ${blobChunks} (upload_id, seq, data)
          select id, ${seq}, decode(${Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("hex")}, 'hex') from upload
          returning seq`,
    ).catch((error: unknown) => {
      throw failure("writing a chunk", error);
    });
    if (rows.length === 0) throw expired();
  }

  /** Keeps an upload that receives bytes slower than a chunk per sweep age from counting as abandoned. */
  async function touch(uploadId: string): Promise<void> {
    const rows = await rowsOf<{ id: string }>(
      db,
      sql`update ${blobUploads} set touched_at = now() where id = ${uploadId} returning id`,
    ).catch((error: unknown) => {
      throw failure("keeping an upload alive", error);
    });
    if (rows.length === 0) throw expired();
  }

  /**
   * Removes an upload that was never committed, with its chunks. Once
   * committed (its `blob_uploads` row gone), its chunks are a blob's bytes
   * and stay: a discard after a commit whose answer was lost must not take
   * them.
   */
  async function removeUpload(uploadId: string): Promise<void> {
    await db.execute(
      sql`with gone as (delete from ${blobUploads} where id = ${uploadId} returning id)
          delete from ${blobChunks} where upload_id in (select id from gone)`,
    );
  }

  const expired = () =>
    new DomainError(
      "aborted",
      "UPLOAD_EXPIRED",
      `the upload received nothing for ${Math.round(abandonedAfterMs / 1000)} s and was removed; upload it again`,
    );

  return {
    async stage(source, maxBytes) {
      const uploadId = randomUUID();
      await db.insert(blobUploads).values({ id: uploadId });
      const bytes = countingHash(source, maxBytes);
      let seq = 0;
      let chunk = Buffer.allocUnsafe(chunkBytes);
      let filled = 0;
      // One chunk written while the next one fills: receiving, hashing and
      // the round trip to the database overlap.
      let writing: Promise<void> = Promise.resolve();
      let touched = Date.now();
      const flush = async () => {
        touched = Date.now();
        await writing;
        writing = writeChunk(uploadId, seq++, chunk.subarray(0, filled));
        // Handled here, awaited on the next flush: a failed write must not
        // surface as an unhandled rejection while the next chunk arrives.
        writing.catch(() => {});
        chunk = Buffer.allocUnsafe(chunkBytes);
        filled = 0;
      };
      try {
        for await (const data of bytes) {
          if (Date.now() - touched > abandonedAfterMs / 4) {
            touched = Date.now();
            await touch(uploadId);
          }
          let taken = 0;
          while (taken < data.byteLength) {
            const n = Math.min(chunkBytes - filled, data.byteLength - taken);
            chunk.set(data.subarray(taken, taken + n), filled);
            filled += n;
            taken += n;
            if (filled === chunkBytes) await flush();
          }
        }
        if (filled > 0) await flush();
        await writing;
      } catch (error) {
        await writing.catch(() => {});
        // When the database is gone this fails too: removeAbandoned clears it later.
        await removeUpload(uploadId).catch(() => {});
        throw error;
      }
      const sha256 = bytes.sha256();
      const size = bytes.size;
      return {
        sha256,
        size,
        async commit(options = {}) {
          await db.transaction(async (tx) => {
            const [held] = await tx
              .delete(blobUploads)
              .where(eq(blobUploads.id, uploadId))
              .returning({ id: blobUploads.id });
            if (!held) throw expired();
            if (options.replace) {
              // The corrupt copy goes, chunks and all; these bytes take its name.
              const [old] = await tx
                .delete(blobs)
                .where(eq(blobs.sha256, sha256))
                .returning({ uploadId: blobs.uploadId });
              if (old) await tx.delete(blobChunks).where(eq(blobChunks.uploadId, old.uploadId));
            }
            // A concurrent commit of the same bytes waits here on the primary
            // key until the first commits, then finds the row: both succeed.
            const [named] = await tx
              .insert(blobs)
              .values({ sha256, uploadId, sizeBytes: size, chunkBytes })
              .onConflictDoNothing({ target: blobs.sha256 })
              .returning({ sha256: blobs.sha256 });
            if (!named) await tx.delete(blobChunks).where(eq(blobChunks.uploadId, uploadId));
          });
        },
        discard: () => removeUpload(uploadId),
      };
    },

    read(sha256, range) {
      let blob: { uploadId: string; sizeBytes: number; chunkBytes: number } | undefined;
      let seq = 0;
      let last = -1;
      let start = 0;
      let end = -1;
      async function next(): Promise<Buffer | null> {
        if (!blob) {
          const [row] = await db
            .select({
              uploadId: blobs.uploadId,
              sizeBytes: blobs.sizeBytes,
              chunkBytes: blobs.chunkBytes,
            })
            .from(blobs)
            .where(eq(blobs.sha256, sha256));
          if (!row) throw new Error(`blob ${sha256} not found`);
          blob = row;
          start = range?.start ?? 0;
          end = Math.min(range?.end ?? row.sizeBytes - 1, row.sizeBytes - 1);
          seq = Math.floor(start / row.chunkBytes);
          last = start > end ? -1 : Math.floor(end / row.chunkBytes);
        }
        if (seq > last) return null;
        const base = seq * blob.chunkBytes;
        const from = Math.max(start - base, 0);
        const to = Math.min(end - base, blob.chunkBytes - 1);
        const [row] = await rowsOf<{ hex: string }>(
          db,
          sql`select encode(substring(data from ${from + 1}::int for ${to - from + 1}::int), 'hex') as hex
              from ${blobChunks} where upload_id = ${blob.uploadId} and seq = ${seq}`,
        );
        if (!row) throw new Error(`chunk ${seq} of blob ${sha256} is missing`);
        seq++;
        return Buffer.from(row.hex, "hex");
      }
      // Room for one chunk read ahead while the previous one is sent.
      return new Readable({
        highWaterMark: chunkBytes,
        read() {
          next().then(
            (data) => {
              if (!this.destroyed) this.push(data);
            },
            (error: unknown) => this.destroy(failure(`reading blob ${sha256}`, error)),
          );
        },
      });
    },

    async has(sha256) {
      const [row] = await db
        .select({ sha256: blobs.sha256 })
        .from(blobs)
        .where(eq(blobs.sha256, sha256));
      return row !== undefined;
    },

    async remove(sha256) {
      await db.execute(
        sql`with gone as (delete from ${blobs} where sha256 = ${sha256} returning upload_id)
            delete from ${blobChunks} where upload_id in (select upload_id from gone)`,
      );
    },

    async removeAbandoned() {
      const gone = await rowsOf<{ id: string }>(
        db,
        sql`with gone as (
              delete from ${blobUploads}
              where touched_at < now() - make_interval(secs => ${abandonedAfterMs / 1000}::float8)
              returning id
            ), chunks as (
              delete from ${blobChunks} where upload_id in (select id from gone)
            )
            select id from gone`,
      );
      return gone.length;
    },
  };
}

/**
 * A failed statement of the blob store, as an error with the driver's error
 * as its cause (so that a lost connection is still recognised as
 * `unavailable`) but without Drizzle's message: that holds the statement's
 * parameters, here a chunk of bytes. Other errors pass as they are.
 */
function failure(what: string, error: unknown): Error {
  if (isStorageFull(error)) return storageFull();
  if (!(error instanceof DrizzleQueryError)) {
    return error instanceof Error ? error : new Error(String(error));
  }
  return new Error(`blob store: ${what} failed`, { cause: error.cause });
}
