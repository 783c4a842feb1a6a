import { type Task, TaskState } from "../../gen/meshwork/v1/task_pb.js";

// The errors of the client's public API, exported by index.ts (meshwork/client).

/**
 * The rejection of `tasks.result()` (and `tasks.run()`) for a task that
 * ended without succeeding: FAILED (out of attempts, not retryable, past its
 * deadline or timeout, a dependency failed) or CANCELED. `code` and
 * `message` are the task's error (TaskError): the worker's error code,
 * `TIMEOUT`, `DEADLINE_EXCEEDED`, `DEPENDENCY_FAILED`, `LEASE_EXPIRED`, …
 */
export class TaskFailedError extends Error {
  readonly taskId: string;
  /** TaskState.FAILED or TaskState.CANCELED. */
  readonly state: TaskState;
  /** The task's error code ("" when it has none, e.g. cancelled without one). */
  readonly code: string;
  /** The task as it ended. */
  readonly task: Task;
  constructor(task: Task) {
    const code = task.error?.code ?? "";
    const said = task.error?.message ?? "";
    const how = task.state === TaskState.CANCELED ? "was canceled" : "failed";
    super(`task ${task.taskId} ${how}${code ? ` (${code})` : ""}${said ? `: ${said}` : ""}`);
    this.name = "TaskFailedError";
    this.taskId = task.taskId;
    this.state = task.state;
    this.code = code;
    this.task = task;
  }

  /** Whether the task was cancelled rather than failed. */
  get canceled(): boolean {
    return this.state === TaskState.CANCELED;
  }
}

/**
 * The rejection of `tasks.result()` when `timeoutMs` passed before the task
 * finished. The task is left as it is (it is not cancelled); `task` is the
 * last state seen, if any.
 */
export class TaskWaitTimeoutError extends Error {
  readonly taskId: string;
  readonly timeoutMs: number;
  readonly task: Task | undefined;
  constructor(taskId: string, timeoutMs: number, task: Task | undefined) {
    super(`task ${taskId} did not finish within ${timeoutMs} ms`);
    this.name = "TaskWaitTimeoutError";
    this.taskId = taskId;
    this.timeoutMs = timeoutMs;
    this.task = task;
  }
}
