import { v7 } from "uuid";

/**
 * A new task's id: a time-ordered UUID (RFC 9562 version 7: 48 bits of
 * Unix milliseconds, then random bits; ids made by this process in the
 * same millisecond still sort in the order they were made).
 *
 * Every change of a task's state writes a new entry for its id into
 * tasks_pkey and task_events_task_idx, and the events' foreign key looks
 * the id up in tasks_pkey. With random ids the 32 tasks of one claim sat
 * on 32 different leaf pages of each, spread over indexes that grow with
 * the table: a claim of 32 plus its CompleteTasks cost PostgreSQL 15.6 ms
 * of CPU at 1,000,000 PENDING tasks against 8.1 ms at 10,000. Tasks
 * created together have neighbouring ids, and a queue claims them close
 * together, so their entries share a few pages: 8.95 ms at 1,000,000
 * (bench/RESULTS.md, a backlog of one workload claimed in order).
 *
 * Ids stay opaque to clients (task.proto): the time in them is the
 * coordinator's clock when it made the id, about the task's created_at,
 * which a Task answers anyway.
 */
export function newTaskId(): string {
  return v7();
}
