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
import { tasks } from "./tables.js";

// The tables of workflows (docs/workflows.md): dependency edges, task log
// tails, cron schedules. The task columns they work with are on tasks.

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
