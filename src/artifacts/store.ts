import { randomUUID } from "node:crypto";
import { and, asc, eq, inArray, isNull, type SQL, sql } from "drizzle-orm";
import { DomainError } from "../core/errors.js";
import { leaseHeld, leaseParams, readLeaseRefusal } from "../core/lease-check.js";
import type { LeaseRef } from "../core/lease-ref.js";
import { byTimeAndId, keysetAfter, type Position, pageOf } from "../core/paging.js";
import type { Db } from "../db/database.js";
import {
  type ArtifactKindName,
  type ArtifactRow,
  artifacts,
  corruptBlobs,
  tasks,
} from "../db/schema/index.js";

export interface NewArtifact {
  taskId: string | null;
  attempt: number;
  workerId: string | null;
  filename: string;
  contentType: string;
  kind: ArtifactKindName;
  sha256: string;
  sizeBytes: number;
}

/**
 * The advisory lock class of one blob's bytes, with `hashtext(sha256)` as
 * the object: an upload committing a row for the bytes takes it shared,
 * retention removing the bytes takes it exclusive (tasks/retention.ts).
 */
export const blobLockClass = 726_355;

/** `pg_advisory_xact_lock[_shared](class, hashtext(sha256))`: held to the end of the transaction. */
export function lockBlob(sha256: string, mode: "shared" | "exclusive"): SQL {
  return mode === "shared"
    ? sql`select pg_advisory_xact_lock_shared(${blobLockClass}::int, hashtext(${sha256}))`
    : sql`select pg_advisory_xact_lock(${blobLockClass}::int, hashtext(${sha256}))`;
}

/** Artifact rows, and the lease checks that guard task artifacts. */
export function createArtifactStore(db: Db) {
  /** Throws the lease refusal unless `l` holds a live lease (in `tx`, locking the task row FOR SHARE). */
  async function assertLease(tx: Db, l: LeaseRef, lock: boolean): Promise<void> {
    // The same lease check as every lease transition (core/lease-check.ts).
    const q = tx.select({ id: tasks.id }).from(tasks).where(leaseHeld);
    const params = leaseParams(l);
    const [held] = lock ? await q.for("share").execute(params) : await q.execute(params);
    if (held) return;
    throw await readLeaseRefusal(tx, l);
  }

  return {
    /** The lease check made before the first byte of an upload is stored. */
    checkLease: (l: LeaseRef) => assertLease(db, l, false),

    /**
     * Commits the row of a durable blob. For a task artifact the lease is
     * checked again in the same transaction, so nothing is kept for a lease
     * lost during the upload. With `bytesPresent`, the blob's lock is held
     * shared and the bytes must still be there: retention, which removes
     * bytes no row names under the same lock taken exclusive, may have
     * removed them after this upload found them stored already (equal
     * bytes are kept once). Then nothing is kept and the upload is refused
     * (`aborted`, to be sent again).
     */
    async insert(
      a: NewArtifact,
      lease: LeaseRef | null,
      bytesPresent?: () => Promise<boolean>,
      replaced = false,
    ): Promise<ArtifactRow> {
      return db.transaction(async (tx) => {
        // Good bytes were just stored under this hash in place of a corrupt
        // copy: the mark goes. Bytes kept as they were keep theirs.
        if (replaced) await tx.delete(corruptBlobs).where(eq(corruptBlobs.sha256, a.sha256));
        if (lease) await assertLease(tx, lease, true);
        if (bytesPresent) {
          await tx.execute(lockBlob(a.sha256, "shared"));
          if (!(await bytesPresent())) {
            throw new DomainError(
              "aborted",
              "ARTIFACT_BYTES_REMOVED",
              "the stored bytes this upload matched were removed meanwhile (retention); upload it again",
            );
          }
        }
        const [row] = await tx
          .insert(artifacts)
          .values({ id: randomUUID(), ...a })
          .returning();
        if (!row) throw new Error("artifact insert returned nothing");
        return row;
      });
    },

    /**
     * Removes an INPUT artifact stored for a create that did not use it (an
     * idempotent repeat answered with the existing task, or a refused
     * create), unless some task names it. The bytes stay: blobs are shared
     * by content and never deleted here.
     */
    async removeUnusedInputs(ids: string[]): Promise<void> {
      if (ids.length === 0) return;
      await db
        .delete(artifacts)
        .where(
          and(
            inArray(artifacts.id, ids),
            eq(artifacts.kind, "INPUT"),
            isNull(artifacts.taskId),
            sql`not exists (select 1 from ${tasks} t where t.input->>'artifactId' = ${artifacts.id}::text)`,
          ),
        );
    },

    /** Whether the bytes under this hash were found corrupt (and not uploaded again since). */
    async isCorrupt(sha256: string): Promise<boolean> {
      const [row] = await db
        .select({ sha256: corruptBlobs.sha256 })
        .from(corruptBlobs)
        .where(eq(corruptBlobs.sha256, sha256));
      return row !== undefined;
    },

    /** Records that the bytes under this hash do not hash to it. */
    async markCorrupt(sha256: string): Promise<void> {
      await db.insert(corruptBlobs).values({ sha256 }).onConflictDoNothing();
    },

    /** Forgets a corrupt mark (the bytes read back good again). */
    async clearCorrupt(sha256: string): Promise<void> {
      await db.delete(corruptBlobs).where(eq(corruptBlobs.sha256, sha256));
    },

    /**
     * The distinct non-empty blobs artifacts name, by hash after `after`, at
     * most `limit`: with their size and the ids of the artifacts that hold them.
     */
    async blobs(
      after: string,
      limit: number,
    ): Promise<{ sha256: string; sizeBytes: number; artifactIds: string[] }[]> {
      const rows = await db
        .select({
          sha256: artifacts.sha256,
          sizeBytes: sql<number>`max(${artifacts.sizeBytes})`,
          artifactIds: sql<string[]>`array_agg(${artifacts.id}::text order by ${artifacts.id})`,
        })
        .from(artifacts)
        .where(and(sql`${artifacts.sha256} > ${after}`, sql`${artifacts.sizeBytes} > 0`))
        .groupBy(artifacts.sha256)
        .orderBy(asc(artifacts.sha256))
        .limit(limit);
      return rows.map((r) => ({ ...r, sizeBytes: Number(r.sizeBytes) }));
    },

    async get(id: string): Promise<ArtifactRow> {
      const [row] = await db.select().from(artifacts).where(eq(artifacts.id, id));
      if (!row) throw new DomainError("not_found", "NOT_FOUND", `artifact ${id} not found`);
      return row;
    },

    /** A task's artifacts, oldest first. */
    async list(
      taskId: string,
      size: number,
      after: Position | undefined,
    ): Promise<{ rows: ArtifactRow[]; next: string }> {
      const rows = await db
        .select()
        .from(artifacts)
        .where(
          and(
            eq(artifacts.taskId, taskId),
            keysetAfter([artifacts.createdAt, artifacts.id], after, "asc"),
          ),
        )
        .orderBy(asc(artifacts.createdAt), asc(artifacts.id))
        .limit(size + 1);
      return pageOf(rows, size, (r) => byTimeAndId(r.createdAt, r.id));
    },
  };
}

export type ArtifactStore = ReturnType<typeof createArtifactStore>;
