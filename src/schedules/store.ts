import { and, asc, eq, gt, isNotNull, lte, not, or, type SQL, sql } from "drizzle-orm";
import { DomainError, notFound } from "../core/errors.js";
import { stateIs } from "../core/task-sql.js";
import { isUuid } from "../core/validate.js";
import type { Db } from "../db/database.js";
import { schedules, tasks } from "../db/schema/index.js";
import { asNumber, rowsOf } from "../db/values.js";
import { createTaskStore, type TaskStore } from "../tasks/store.js";

export type ScheduleRow = typeof schedules.$inferSelect;

/** A validated, defaulted schedule to create (schedules/convert.ts). */
export interface NewSchedule {
  name: string;
  cron: string;
  timeZone: string;
  template: Record<string, unknown>;
  overlapPolicy: "SKIP" | "ALLOW";
  catchUpPolicy: "SKIP" | "ONE" | "ALL";
  catchUpLimit: number;
  paused: boolean;
  nextRunAt: Date | null;
  requestHash: string;
  createdBy: string;
  /** The template's input artifact ("" for none), checked by the service. */
  inputArtifactId: string;
}

/** A due schedule, locked by the transaction that runs its ticks. */
export interface DueSchedule {
  row: ScheduleRow;
  /** The database's clock, at the start of the transaction. */
  now: Date;
  /** The task store bound to the same transaction: the ticks' tasks commit with the schedule. */
  tasks: TaskStore;
  /** The handle of the transaction (reads the ticks need besides tasks, such as an input artifact). */
  tx: Db;
  /** Whether a task of this schedule is live (PENDING, ASSIGNED or RUNNING). */
  hasLiveTask(): Promise<boolean>;
}

/** What a schedule's ticks did: the schedule's new next and last runs, and its last task. */
export interface TickOutcome {
  nextRunAt: Date | null;
  lastRunAt: Date | null;
  /** The last task created (undefined: keep the one recorded). */
  lastTaskId?: string | undefined;
}

/** A schedule named by its id (when the value is a UUID) or its name. */
function named(ref: string): SQL | undefined {
  return isUuid(ref) ? or(eq(schedules.id, ref), eq(schedules.name, ref)) : eq(schedules.name, ref);
}

/** The database's clock (the start of the current transaction), to the millisecond. */
async function now(db: Db): Promise<Date> {
  const [row] = await rowsOf<{ ms: number | string }>(
    db,
    sql`select floor(extract(epoch from now()) * 1000)::float8 as ms`,
  );
  if (!row) throw new Error("select now() returned no row");
  return new Date(asNumber(row.ms));
}

/**
 * Schedules: their rows, and the claim of a due schedule's ticks. A tick is
 * claimed by locking its schedule's row (`FOR UPDATE SKIP LOCKED`: another
 * replica passes it by) in the transaction that creates its tasks and moves
 * next_run_at on, so that each tick creates its task once, however many
 * replicas tick.
 */
export function createScheduleStore(db: Db) {
  const get = async (ref: string, tx: Db = db, lock = false): Promise<ScheduleRow> => {
    const q = tx.select().from(schedules).where(named(ref)).limit(1);
    const [row] = lock ? await q.for("update") : await q;
    if (!row) throw notFound(`schedule ${ref}`);
    return row;
  };
  return {
    /** The database's clock. */
    now: () => now(db),

    /**
     * Creates a schedule. Its name is its idempotency key: the same name
     * with the same request returns the schedule made before; with another
     * request it is `already_exists`.
     */
    async create(id: string, s: NewSchedule): Promise<{ row: ScheduleRow; created: boolean }> {
      const { inputArtifactId: _, ...values } = s;
      const [row] = await db
        .insert(schedules)
        .values({ id, ...values })
        .onConflictDoNothing({ target: schedules.name })
        .returning();
      if (row) return { row, created: true };
      const existing = await get(s.name);
      if (existing.requestHash !== s.requestHash) {
        throw new DomainError(
          "already_exists",
          "IDEMPOTENCY_KEY_REUSED",
          `schedule ${JSON.stringify(s.name)} exists with a different request (schedule ${existing.id})`,
        );
      }
      return { row: existing, created: false };
    },

    get: (ref: string) => get(ref),

    /** One page by name, after the name `after`, and the rows to tell whether more follow (size + 1). */
    async list(after: string | undefined, size: number): Promise<ScheduleRow[]> {
      return db
        .select()
        .from(schedules)
        .where(after === undefined ? undefined : gt(schedules.name, after))
        .orderBy(asc(schedules.name))
        .limit(size + 1);
    },

    /** Pauses a schedule (a paused one stays as it is); next_run_at is unset. */
    async pause(ref: string): Promise<ScheduleRow> {
      const current = await get(ref);
      const [row] = await db
        .update(schedules)
        .set({ paused: true, nextRunAt: null, updatedAt: sql`now()` })
        .where(and(eq(schedules.id, current.id), not(schedules.paused)))
        .returning();
      return row ?? get(current.id);
    },

    /**
     * Resumes a paused schedule from now: `next` gives its next tick after
     * the database's now (the ticks missed while paused are not caught up).
     * A schedule that is not paused stays as it is.
     */
    async resume(ref: string, next: (row: ScheduleRow, now: Date) => Date | null) {
      return db.transaction(async (tx) => {
        const row = await get(ref, tx, true);
        if (!row.paused) return row;
        const [updated] = await tx
          .update(schedules)
          .set({ paused: false, nextRunAt: next(row, await now(tx)), updatedAt: sql`now()` })
          .where(eq(schedules.id, row.id))
          .returning();
        if (!updated) throw new Error("a locked schedule was not updated");
        return updated;
      });
    },

    /** Deletes a schedule; the tasks it created stay. */
    async remove(ref: string): Promise<void> {
      const deleted = await db.delete(schedules).where(named(ref)).returning({ id: schedules.id });
      if (deleted.length === 0) throw notFound(`schedule ${ref}`);
    },

    /**
     * Runs `create` with the schedule locked (waiting for a tick that runs
     * it now) and records the task it returns as the schedule's last task,
     * in one transaction.
     */
    async trigger<T extends { id: string }>(
      ref: string,
      create: (row: ScheduleRow, tasks: TaskStore, tx: Db) => Promise<T>,
    ): Promise<T> {
      return db.transaction(async (tx) => {
        const row = await get(ref, tx, true);
        const task = await create(row, createTaskStore(tx), tx);
        await tx
          .update(schedules)
          .set({ lastTaskId: task.id, updatedAt: sql`now()` })
          .where(eq(schedules.id, row.id));
        return task;
      });
    },

    /**
     * Claims the schedule due first that no other transaction holds, runs
     * its ticks (`run`) and records their outcome, in one transaction: the
     * tasks and the schedule's move commit together, or neither does (a
     * replica killed before the commit leaves the ticks to another).
     * Undefined when nothing is due.
     */
    async tickDue(
      run: (due: DueSchedule) => Promise<TickOutcome>,
    ): Promise<TickOutcome | undefined> {
      return db.transaction(async (tx) => {
        const [row] = await tx
          .select()
          .from(schedules)
          .where(
            and(
              not(schedules.paused),
              isNotNull(schedules.nextRunAt),
              lte(schedules.nextRunAt, sql`now()`),
            ),
          )
          .orderBy(asc(schedules.nextRunAt))
          .limit(1)
          .for("update", { skipLocked: true });
        if (!row) return undefined;
        const outcome = await run({
          row,
          now: await now(tx),
          tasks: createTaskStore(tx),
          tx,
          async hasLiveTask() {
            const live = await tx
              .select({ id: tasks.id })
              .from(tasks)
              .where(and(eq(tasks.scheduleId, row.id), stateIs("PENDING", "ASSIGNED", "RUNNING")))
              .limit(1);
            return live.length > 0;
          },
        });
        await tx
          .update(schedules)
          .set({
            nextRunAt: outcome.nextRunAt,
            lastRunAt: outcome.lastRunAt,
            ...(outcome.lastTaskId !== undefined && { lastTaskId: outcome.lastTaskId }),
            updatedAt: sql`now()`,
          })
          .where(eq(schedules.id, row.id));
        return outcome;
      });
    },
  };
}

export type ScheduleStore = ReturnType<typeof createScheduleStore>;
