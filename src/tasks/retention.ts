import { sql } from "drizzle-orm";
import type { BlobStore } from "../artifacts/blob-store.js";
import { lockBlob } from "../artifacts/store.js";
import type { Db } from "../db/database.js";
import { asBoolean, asNumber, rowsOf } from "../db/values.js";
import type { Logger } from "../log.js";

/** What retention uses: the housekeeping handle, the blob store, the log. */
export interface RetentionDeps {
  /**
   * The sweeper's handle (its own connection on PostgreSQL): the lock and
   * the batches, each a statement of a few milliseconds.
   */
  db: Db;
  /**
   * Where a blob's removal holds its lock (the request pool; default `db`):
   * that transaction lasts as long as the blob store's call, an S3 request
   * perhaps, which must not hold up the sweeper's connection.
   */
  blobDb?: Db;
  blobs: Pick<BlobStore, "remove">;
  log: Pick<Logger, "info" | "debug" | "warn" | "error">;
}

export interface RetentionOptions {
  /** Terminal tasks finished longer ago than this are deleted; 0 = never. */
  retentionMs: number;
  /** Tasks per DELETE statement (one short transaction each). */
  batchSize?: number;
  /** Batches per run at most; the rest waits for the next run. */
  maxBatches?: number;
  /** Between runs. */
  intervalMs?: number;
  /** From start() to the first run. */
  firstRunMs?: number;
}

/** What one run did (tests read it; the log line says the same). */
export interface RetentionRun {
  /** False when another replica held the lock: this one did nothing. */
  ran: boolean;
  tasks: number;
  artifacts: number;
  blobs: number;
  /** Blobs whose removal failed: left in the store as orphan bytes. */
  blobsFailed: number;
  /**
   * Of `artifacts`, the INPUT artifacts no task named, deleted once older
   * than the retention (in batches of their own, not in `batches`).
   */
  orphanInputs: number;
  batches: number;
}

/** The advisory lock only one replica holds while it deletes (migrations take 7263550101). */
export const retentionLockKey = 7263550102;

/**
 * Deletes terminal tasks (SUCCEEDED, FAILED, CANCELED) finished longer ago
 * than the retention, with their artifact rows, then the bytes no artifact
 * row names any more (README: Retention).
 *
 * - One replica at a time: a run starts with `pg_try_advisory_lock` on the
 *   housekeeping connection and does nothing when another replica holds it.
 * - Small batches: each batch is one statement (its own transaction) over at
 *   most `batchSize` tasks, picked oldest first through the partial index
 *   tasks_finished_idx, `FOR UPDATE SKIP LOCKED`, reaching rows by primary
 *   key; the hot path never waits on it.
 * - Kept: a task one of whose artifacts another task names as its input;
 *   an INPUT artifact (uploaded without a task) while any remaining task
 *   names it; bytes while any artifact row names them (artifacts are
 *   content-addressed: equal bytes are stored once for many rows).
 * - Orphan inputs: an INPUT artifact no task names, older than the
 *   retention, goes too (uploaded and never used, or outliving its tasks).
 * - Bytes go after the rows are committed: a crash in between leaves
 *   orphan bytes in the blob store, never a row without bytes.
 */
export function createRetention(deps: RetentionDeps, options: RetentionOptions) {
  const batchSize = options.batchSize ?? 500;
  const maxBatches = options.maxBatches ?? 20;
  const intervalMs = options.intervalMs ?? 60_000;
  const firstRunMs = options.firstRunMs ?? 10_000;
  const secs = options.retentionMs / 1000;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<RetentionRun> | undefined;
  let stopping = false;

  /** Deletes one batch of tasks and their artifact rows; returns the bytes they named. */
  async function deleteBatch(): Promise<{ tasks: number; artifacts: number; shas: string[] }> {
    // Nested loops on indexes only, whatever the statistics: with hash or
    // merge joins allowed, the reference checks were planned over every task
    // (a merge anti-join by primary key, 1.5 s a run at 1,000,000 finished
    // tasks; a hash of all of them), and with the tables' early sizes as
    // the planner's guess, over sequential scans.
    const [row] = await deps.db.transaction(async (tx) => {
      await tx.execute(sql`set local enable_seqscan = off`);
      await tx.execute(sql`set local enable_hashjoin = off`);
      await tx.execute(sql`set local enable_mergejoin = off`);
      // An ordered index scan that stops at the batch, not a bitmap of every
      // entry below the cutoff (dead ones included, until vacuum).
      await tx.execute(sql`set local enable_bitmapscan = off`);
      return rowsOf<{
        tasks: number | string;
        artifacts: number | string;
        shas: string;
      }>(
        tx,
        // The candidates first, alone: an ordered scan of tasks_finished_idx
        // that stops at the batch size. With the reference check in the same
        // query, the planner chose a merge anti-join over every task by
        // primary key (1.5 s a run at 1,000,000 finished tasks, none old).
        // A candidate that is still referenced is left for a later run.
        sql`with candidates as materialized (
            select t.id, t.input->>'artifactId' as input_id
            from tasks t
            where t.state in ('SUCCEEDED', 'FAILED', 'CANCELED')
              and t.finished_at < now() - make_interval(secs => ${secs}::float8)
            order by t.finished_at
            limit ${batchSize}::int
            for update of t skip locked
          ),
          doomed as materialized (
            select c.id, c.input_id from candidates c
            where not exists (
              select 1 from artifacts a join tasks u
                on u.input is not null and u.input->>'artifactId' = a.id::text
              where a.task_id = c.id and u.id <> c.id)
              -- A dependency stays while a task that waits for it or runs
              -- lives: its outputs are that task's inputs (docs/workflows.md).
              and not exists (
                select 1 from task_dependencies d join tasks u on u.id = d.task_id
                where d.depends_on = c.id and u.state in ('PENDING', 'ASSIGNED', 'RUNNING'))
          ),
          gone_tasks as (
            delete from tasks where id = any(array(select id from doomed)) returning id
          ),
          gone_own as (
            delete from artifacts where task_id = any(array(select id from doomed))
            returning sha256
          ),
          gone_inputs as (
            delete from artifacts a
            where a.id = any(array(select input_id::uuid from doomed where input_id is not null))
              -- Uploaded without a task (kind INPUT means task_id is null):
              -- kind, not task_id, so that the plan reaches the rows by
              -- primary key rather than by every input in artifacts_task_idx.
              and a.kind = 'INPUT'
              and not exists (
                select 1 from tasks u
                where u.input is not null and u.input->>'artifactId' = a.id::text
                  and u.id <> all(array(select id from doomed)))
              and not exists (select 1 from schedules s where s.template->>'inputArtifactId' = a.id::text)
            returning a.sha256
          )
          select (select count(*) from gone_tasks)::int as tasks,
            ((select count(*) from gone_own) + (select count(*) from gone_inputs))::int as artifacts,
            coalesce((select string_agg(distinct sha256, ',')
              from (select sha256 from gone_own union all select sha256 from gone_inputs) s), '') as shas`,
      );
    });
    return {
      tasks: asNumber(row?.tasks),
      artifacts: asNumber(row?.artifacts),
      shas: row?.shas ? row.shas.split(",") : [],
    };
  }

  /**
   * Deletes one batch of orphan inputs: INPUT artifacts uploaded without a
   * task, older than the retention, that no task names (an input uploaded
   * and never used, or whose tasks were all deleted before it aged); returns
   * the bytes they named.
   *
   * A create that names an input locks it (FOR KEY SHARE) in the
   * transaction that inserts the task (tasks/store.ts), so the orphans are
   * locked first, skipping any a create holds, and the DELETE checks again,
   * in a statement of its own that sees every task committed by then: a
   * task created between the two is seen; one whose create comes after the
   * lock waits for this transaction and then finds its input gone (refused,
   * never acknowledged with an input that no longer exists).
   */
  async function deleteOrphanInputs(): Promise<{ artifacts: number; shas: string[] }> {
    const [row] = await deps.db.transaction(async (tx) => {
      await tx.execute(sql`set local enable_seqscan = off`);
      const db = tx;
      // Oldest first through artifacts_task_idx (task_id is null), by
      // primary key from there; a task's reference by tasks_input_artifact_idx.
      const doomed = await rowsOf<{ id: string }>(
        db,
        sql`select a.id from artifacts a
          where a.task_id is null and a.kind = 'INPUT'
            and a.created_at < now() - make_interval(secs => ${secs}::float8)
            and not exists (
              select 1 from tasks t
              where t.input is not null and t.input->>'artifactId' = a.id::text)
            -- A schedule's template names it: its next tick's input.
            and not exists (select 1 from schedules s where s.template->>'inputArtifactId' = a.id::text)
          order by a.created_at
          limit ${batchSize}::int
          for update of a skip locked`,
      );
      if (doomed.length === 0) return [{ artifacts: 0, shas: "" }];
      return rowsOf<{ artifacts: number | string; shas: string }>(
        db,
        sql`with gone as (
            delete from artifacts a
            where a.id = any(${`{${doomed.map((d) => d.id).join(",")}}`}::uuid[])
              and not exists (
                select 1 from tasks t
                where t.input is not null and t.input->>'artifactId' = a.id::text)
              and not exists (select 1 from schedules s where s.template->>'inputArtifactId' = a.id::text)
            returning sha256
          )
          select (select count(*) from gone)::int as artifacts,
            coalesce((select string_agg(distinct sha256, ',') from gone), '') as shas`,
      );
    });
    return { artifacts: asNumber(row?.artifacts), shas: row?.shas ? row.shas.split(",") : [] };
  }

  /**
   * Removes the bytes of `shas` that no artifact row names; returns how many
   * went and failed. Each under its blob's lock, exclusive: an upload that
   * found the same bytes stored and commits its row meanwhile either commits
   * first (the bytes are kept) or finds them gone and is refused
   * (artifacts/store.ts, insert).
   */
  async function removeBlobs(shas: string[]): Promise<{ removed: number; failed: number }> {
    const remove = deps.blobs.remove?.bind(deps.blobs);
    if (shas.length === 0 || !remove) return { removed: 0, failed: 0 };
    let removed = 0;
    let failed = 0;
    for (const sha256 of shas) {
      try {
        const gone = await (deps.blobDb ?? deps.db).transaction(async (tx) => {
          await tx.execute(lockBlob(sha256, "exclusive"));
          const [named] = await rowsOf<{ one: number }>(
            tx,
            sql`select 1 as one from artifacts where sha256 = ${sha256} limit 1`,
          );
          if (named) return false;
          await remove(sha256);
          return true;
        });
        if (gone) removed++;
      } catch (error) {
        failed++;
        if (failed === 1) deps.log.warn({ err: error }, "retention: removing a blob failed");
      }
    }
    return { removed, failed };
  }

  async function tryLock(): Promise<boolean> {
    const [row] = await rowsOf<{ locked: boolean | string }>(
      deps.db,
      sql`select pg_try_advisory_lock(${retentionLockKey}::bigint) as locked`,
    );
    return asBoolean(row?.locked);
  }

  async function run(): Promise<RetentionRun> {
    const done: RetentionRun = {
      ran: false,
      tasks: 0,
      artifacts: 0,
      blobs: 0,
      blobsFailed: 0,
      orphanInputs: 0,
      batches: 0,
    };
    if (options.retentionMs <= 0) return done;
    if (!(await tryLock())) {
      deps.log.debug("retention: another replica is deleting; skipped");
      return done;
    }
    done.ran = true;
    try {
      while (done.batches < maxBatches && !stopping) {
        const batch = await deleteBatch();
        done.batches++;
        done.tasks += batch.tasks;
        done.artifacts += batch.artifacts;
        const blobs = await removeBlobs(batch.shas);
        done.blobs += blobs.removed;
        done.blobsFailed += blobs.failed;
        if (batch.tasks < batchSize) break;
      }
      // Then inputs no task names any more, older than the retention (batches of their own).
      for (let n = 0; n < maxBatches && !stopping; n++) {
        const orphans = await deleteOrphanInputs();
        done.artifacts += orphans.artifacts;
        done.orphanInputs += orphans.artifacts;
        const blobs = await removeBlobs(orphans.shas);
        done.blobs += blobs.removed;
        done.blobsFailed += blobs.failed;
        if (orphans.artifacts < batchSize) break;
      }
    } finally {
      // On a connection lost meanwhile the lock went with its session.
      await rowsOf(deps.db, sql`select pg_advisory_unlock(${retentionLockKey}::bigint)`).catch(
        () => {},
      );
    }
    const { ran: _, orphanInputs, ...counts } = done;
    if (orphanInputs > 0) Object.assign(counts, { orphanInputs });
    const level = done.tasks > 0 || done.artifacts > 0 || done.blobsFailed > 0 ? "info" : "debug";
    deps.log[level](counts, "retention: deleted finished tasks");
    return done;
  }

  function schedule(ms: number): void {
    if (stopping) return;
    timer = setTimeout(() => {
      runOnce()
        .catch((error: unknown) => deps.log.error({ err: error }, "retention failed"))
        .finally(() => schedule(intervalMs));
    }, ms);
    timer.unref();
  }

  /** Runs now, or waits for the run in progress and answers with it. */
  function runOnce(): Promise<RetentionRun> {
    running ??= run().finally(() => {
      running = undefined;
    });
    return running;
  }

  return {
    /** One run now (tests call this instead of waiting). */
    runOnce,
    /** The first run soon, then one every interval; nothing when the retention is 0. */
    start(): void {
      if (options.retentionMs <= 0) return;
      stopping = false;
      schedule(firstRunMs);
    },
    /** Stops after the batch in progress. */
    async stop(): Promise<void> {
      stopping = true;
      clearTimeout(timer);
      await running?.catch(() => {});
    },
  };
}

export type Retention = ReturnType<typeof createRetention>;
