import { and, asc, eq, gt, sql } from "drizzle-orm";
import { notFound } from "../core/errors.js";
import { leaseHeldBy } from "../core/lease-check.js";
import type { Db } from "../db/database.js";
import { type TaskStateName, taskLogs, taskLogTails, tasks } from "../db/schema/index.js";
import { asNumber, rowsOf } from "../db/values.js";

/**
 * Task log tails: the lines workers send, kept per task up to a cap (the
 * oldest dropped past it, counted in task_log_tails.dropped). A line is
 * kept only while the lease it names is live (the lease check of every
 * lease-bound request, core/lease-check.ts), judged in the INSERT itself.
 */

/** A line to append, checked (logs/lines.ts). */
export interface NewLogLine {
  taskId: string;
  attempt: number;
  workerId: string;
  /** Empty when the sender sent none (then only the holder and attempt are checked). */
  token: string;
  stream: LogStream;
  text: string;
  /** When the worker wrote it; undefined: when it arrived (the database clock). */
  at: Date | undefined;
  /** False: past the task's rate budget, counted as dropped rather than kept. */
  keep: boolean;
}

export type LogStream = "stdout" | "stderr" | "log";

/** A kept line as read. */
export interface LogLineRow {
  sequence: number;
  taskId: string;
  attempt: number;
  workerId: string | null;
  stream: string;
  text: string;
  at: Date;
}

/** What became of a batch: lines kept, and lines dropped for the rate budget, per task held. */
export interface AppendOutcome {
  /** Lines whose lease was held (kept or dropped by the rate budget). */
  held: number;
  accepted: number;
  /** Task ids that got new lines. */
  taskIds: string[];
}

/** One page of a task's lines. */
export interface LogPage {
  lines: LogLineRow[];
  more: boolean;
  dropped: number;
  state: TaskStateName;
}

export function createLogStore(db: Db, linesPerTask: number) {
  const held = leaseHeldBy({
    id: sql`v.task_id`,
    attempt: sql`v.attempt`,
    worker: sql`v.worker_id`,
    token: sql`v.token`,
  });
  return {
    /**
     * Appends a batch in one transaction: one INSERT of every line whose
     * lease is held (and that is within its rate budget), counting them in
     * the task's tail row (which it locks: appenders of one task take turns),
     * then, for a task past the cap, one DELETE of its oldest lines. The
     * batch was cut to the cap per task before (logs/lines.ts), so that the
     * lines deleted are always older than the batch.
     */
    async append(lines: NewLogLine[]): Promise<AppendOutcome> {
      if (lines.length === 0) return { held: 0, accepted: 0, taskIds: [] };
      const json = JSON.stringify(
        lines.map((l, i) => ({
          i,
          task_id: l.taskId,
          attempt: l.attempt,
          worker_id: l.workerId,
          token: l.token,
          stream: l.stream,
          // A line past the rate budget is counted, its text not sent.
          line: l.keep ? l.text : "",
          at: l.at?.toISOString() ?? null,
          keep: l.keep,
        })),
      );
      return db.transaction(async (tx) => {
        const counted = await rowsOf<{ task_id: string; held: unknown; kept: unknown }>(
          tx,
          sql`
          with v as materialized (
            select * from jsonb_to_recordset(${json}::jsonb)
              as v(i int, task_id uuid, attempt int, worker_id uuid, token text,
                   stream text, line text, at timestamptz, keep boolean)
          ),
          ok as materialized (select v.* from v join ${tasks} on ${held}),
          ins as (
            insert into task_logs (task_id, attempt, worker_id, stream, line, at)
            select task_id, attempt, worker_id, stream, line, coalesce(at, now())
            from ok where keep order by i
          ),
          counts as (
            select task_id, count(*) filter (where keep)::int as kept,
                   count(*) filter (where not keep)::int as rated, count(*)::int as held
            from ok group by task_id
          ),
          tails as (
            insert into task_log_tails as t (task_id, kept, dropped)
            select task_id, kept, rated from counts
            on conflict (task_id) do update
              set kept = t.kept + excluded.kept, dropped = t.dropped + excluded.dropped
            returning t.task_id, t.kept
          )
          select c.task_id, c.held, c.kept from counts c join tails using (task_id)`,
        );
        const over = await rowsOf<{ task_id: string }>(
          tx,
          sql`select task_id from task_log_tails
              where task_id = any(${`{${counted.map((c) => c.task_id).join(",")}}`}::uuid[])
                and kept > ${linesPerTask}`,
        );
        if (over.length > 0) {
          // A new statement sees the lines of an appender that held the tail row before.
          await tx.execute(sql`
            with over as (
              select task_id, kept - ${linesPerTask} as excess from task_log_tails
              where task_id = any(${`{${over.map((o) => o.task_id).join(",")}}`}::uuid[])
            ),
            victims as (
              select l.id from over o cross join lateral (
                select id from task_logs where task_id = o.task_id order by id limit o.excess
              ) l
            ),
            gone as (
              delete from task_logs where id in (select id from victims) returning task_id
            )
            update task_log_tails t set kept = t.kept - g.n, dropped = t.dropped + g.n
            from (select task_id, count(*)::int as n from gone group by task_id) g
            where t.task_id = g.task_id`);
        }
        const accepted = counted.reduce((n, c) => n + asNumber(c.kept), 0);
        return {
          held: counted.reduce((n, c) => n + asNumber(c.held), 0),
          accepted,
          taskIds: counted.filter((c) => asNumber(c.kept) > 0).map((c) => c.task_id),
        };
      });
    },

    /**
     * Up to `limit` kept lines of a task after `after` (a sequence), oldest
     * first, of one attempt when `attempt` > 0, with the task's state and
     * its count of dropped lines. An unknown task is not_found.
     */
    async page(taskId: string, after: number, limit: number, attempt = 0): Promise<LogPage> {
      const [task] = await db
        .select({ state: tasks.state, dropped: taskLogTails.dropped })
        .from(tasks)
        .leftJoin(taskLogTails, eq(taskLogTails.taskId, tasks.id))
        .where(eq(tasks.id, taskId));
      if (!task) throw notFound(`task ${taskId}`, { taskId });
      const rows = await db
        .select({
          sequence: taskLogs.id,
          taskId: taskLogs.taskId,
          attempt: taskLogs.attempt,
          workerId: taskLogs.workerId,
          stream: taskLogs.stream,
          text: taskLogs.line,
          at: taskLogs.at,
        })
        .from(taskLogs)
        .where(
          and(
            eq(taskLogs.taskId, taskId),
            gt(taskLogs.id, after),
            attempt > 0 ? eq(taskLogs.attempt, attempt) : undefined,
          ),
        )
        .orderBy(asc(taskLogs.id))
        .limit(limit + 1);
      return {
        lines: rows.slice(0, limit).map((r) => ({ ...r, sequence: asNumber(r.sequence) })),
        more: rows.length > limit,
        dropped: asNumber(task.dropped),
        state: task.state,
      };
    },
  };
}

export type LogStore = ReturnType<typeof createLogStore>;
