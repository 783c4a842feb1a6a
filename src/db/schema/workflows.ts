import { sql } from "drizzle-orm";
import {
  bigint,
  boolean,
  index,
  integer,
  jsonb,
  pgTable,
  primaryKey,
  text,
  timestamp,
  uuid,
} from "drizzle-orm/pg-core";
import { type TaskStateName, tasks } from "./tables.js";

// The tables around tasks: their history, dependency edges, log tails, cron
// schedules (docs/workflows.md), the deliveries of pushed work. The task
// columns they work with are on tasks.

const timestamptz = (name: string) =>
  timestamp(name, { withTimezone: true, mode: "date", precision: 3 });

/**
 * Dependency edges, for the reverse lookup: which tasks wait for a task
 * that just finished (tasks.depends_on holds the forward list). No foreign
 * key on depends_on: retention may delete a finished dependency first.
 */
export const taskDependencies = pgTable(
  "task_dependencies",
  {
    taskId: uuid("task_id")
      .notNull()
      .references(() => tasks.id, { onDelete: "cascade" }),
    dependsOn: uuid("depends_on").notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.taskId, t.dependsOn] }),
    index("task_dependencies_depends_on_idx").on(t.dependsOn),
  ],
);

/**
 * A task's log lines, the bounded tail the coordinator keeps (the oldest
 * dropped past the cap per task). `id` orders them, across tasks: it is the
 * line's `sequence`.
 */
export const taskLogs = pgTable(
  "task_logs",
  {
    id: bigint("id", { mode: "number" }).primaryKey().generatedAlwaysAsIdentity(),
    taskId: uuid("task_id")
      .notNull()
      .references(() => tasks.id, { onDelete: "cascade" }),
    attempt: integer("attempt").notNull(),
    workerId: uuid("worker_id"),
    stream: text("stream").notNull().default("log"),
    line: text("line").notNull(),
    at: timestamptz("at").notNull().defaultNow(),
  },
  (t) => [index("task_logs_task_idx").on(t.taskId, t.id)],
);

/** Per task: how many log lines are kept, and how many were dropped. */
export const taskLogTails = pgTable("task_log_tails", {
  taskId: uuid("task_id")
    .primaryKey()
    .references(() => tasks.id, { onDelete: "cascade" }),
  kept: integer("kept").notNull().default(0),
  dropped: bigint("dropped", { mode: "number" }).notNull().default(0),
});

/**
 * Cron schedules (ScheduleService). A tick is claimed by moving next_run_at
 * on with a conditional UPDATE, in the transaction that creates its task,
 * so that one replica runs it.
 */
export const schedules = pgTable(
  "schedules",
  {
    id: uuid("id").primaryKey(),
    name: text("name").notNull().unique("schedules_name_key"),
    cron: text("cron").notNull(),
    timeZone: text("time_zone").notNull().default("UTC"),
    // The CreateTaskRequest each tick creates, as proto JSON.
    template: jsonb("template").$type<Record<string, unknown>>().notNull(),
    overlapPolicy: text("overlap_policy").$type<"SKIP" | "ALLOW">().notNull().default("SKIP"),
    catchUpPolicy: text("catch_up_policy").$type<"SKIP" | "ONE" | "ALL">().notNull().default("ONE"),
    catchUpLimit: integer("catch_up_limit").notNull().default(10),
    paused: boolean("paused").notNull().default(false),
    nextRunAt: timestamptz("next_run_at"),
    lastRunAt: timestamptz("last_run_at"),
    lastTaskId: uuid("last_task_id"),
    // SHA-256 of the normalised create request, to tell a retry from a conflict.
    requestHash: text("request_hash").notNull(),
    // The creating token's name: the default share of the tasks it creates.
    createdBy: text("created_by").notNull().default(""),
    createdAt: timestamptz("created_at").notNull().defaultNow(),
    updatedAt: timestamptz("updated_at").notNull().defaultNow(),
  },
  (t) => [
    // The ticker's scan: the schedules due first.
    index("schedules_due_idx")
      .on(t.nextRunAt)
      .where(sql`not ${t.paused} and ${t.nextRunAt} is not null`),
  ],
);

/**
 * A task's history: one row when it is created and one each time its state,
 * attempt or lease holder changes, written by a trigger on tasks (migration
 * 0013) so that every path (claims, the sweeper, other replicas) records
 * it in the same transaction. Deleted with its task, by the statement
 * trigger tasks_events_on_delete (migration 0023), not by a foreign key:
 * the key's check, a lookup and a row lock in tasks for every event
 * written, was half of what the history trigger cost a CreateTasks of
 * 1,000 and a sixth of a claim's update (bench/RESULTS.md).
 */
export const taskEvents = pgTable(
  "task_events",
  {
    id: bigint("id", { mode: "number" }).primaryKey().generatedAlwaysAsIdentity(),
    taskId: uuid("task_id").notNull(),
    at: timestamptz("at").notNull().default(sql`clock_timestamp()`),
    state: text("state").$type<TaskStateName>().notNull(),
    attempt: integer("attempt").notNull(),
    workerId: uuid("worker_id"),
    errorCode: text("error_code").notNull().default(""),
    errorMessage: text("error_message").notNull().default(""),
    // `state` (a change of the task) or `dispatch` (a delivery request, its outcome in detail).
    kind: text("kind").$type<"state" | "dispatch">().notNull().default("state"),
    detail: jsonb("detail").$type<Record<string, unknown>>(),
  },
  (t) => [index("task_events_task_idx").on(t.taskId, t.id)],
);

/**
 * The delivery of a pushed attempt (a task with dispatch, placed): one row
 * per task, for its current attempt. A replica claims a due row by moving
 * claimed_until (FOR UPDATE SKIP LOCKED), sends, and records the outcome;
 * a stale attempt (the task placed again, finished) is never sent.
 */
export const deliveries = pgTable(
  "deliveries",
  {
    taskId: uuid("task_id")
      .primaryKey()
      .references(() => tasks.id, { onDelete: "cascade" }),
    attempt: integer("attempt").notNull(),
    workerId: uuid("worker_id").notNull(),
    state: text("state").$type<"DELIVERING" | "ACCEPTED" | "FAILED">().notNull(),
    tries: integer("tries").notNull().default(0),
    nextAt: timestamptz("next_at").notNull().defaultNow(),
    claimedUntil: timestamptz("claimed_until"),
    lastStatus: integer("last_status").notNull().default(0),
    lastError: text("last_error").notNull().default(""),
    lastAt: timestamptz("last_at"),
  },
  (t) => [
    // The dispatchers' scan: due deliveries, oldest first.
    index("deliveries_due_idx").on(t.nextAt).where(sql`${t.state} = 'DELIVERING'`),
  ],
);

export type TaskEventRow = typeof taskEvents.$inferSelect;
export type DeliveryRow = typeof deliveries.$inferSelect;
