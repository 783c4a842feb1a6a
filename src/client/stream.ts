import type { JsonObject } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError } from "@connectrpc/connect";
import {
  type LogLine,
  type Task,
  type TaskService,
  TaskState,
} from "../../gen/meshwork/v1/task_pb.js";
import { isFinished, outcomeOf, type TaskOutcome } from "./convert.js";
import { TaskFailedError, TaskWaitTimeoutError } from "./errors.js";
import { backoffMs, isBrokenStream, type RetryOptions, sleep } from "./rpc.js";

// The server streams of the client (WatchTask, WatchTaskLogs) and what is
// built on them: each reopens a stream that broke (`unavailable`, a dropped
// connection) from where it was, with the retries' backoff.

/** How long to wait, and until when. */
export interface WaitOptions {
  /**
   * Gives up after this long with a TaskWaitTimeoutError (none by default).
   * The task is left alone: it goes on running.
   */
  timeoutMs?: number;
  /** Gives up when it aborts, rejecting with its reason; the task is left alone. */
  signal?: AbortSignal;
}

/**
 * Items of a server stream, reopened by `open` after a broken stream, at
 * most `maxAttempts` times in a row (an item resets the count). A stream
 * that ends cleanly ends the iteration unless `endedEarly()` says it should
 * not have, which counts as broken. An abort of `signal` rejects with its
 * reason.
 */
async function* reopening<T>(
  open: (signal: AbortSignal | undefined) => AsyncIterable<T>,
  o: { signal?: AbortSignal; retry?: RetryOptions; endedEarly: () => boolean },
): AsyncGenerator<T, void, undefined> {
  const tries = Math.max(1, o.retry?.maxAttempts ?? 6);
  let failures = 0;
  for (;;) {
    let broke: unknown;
    try {
      for await (const item of open(o.signal)) {
        failures = 0;
        yield item;
      }
      if (!o.endedEarly()) return;
      broke = new ConnectError("the stream ended early", Code.Unavailable);
    } catch (error) {
      if (o.signal?.aborted) throw o.signal.reason;
      if (!isBrokenStream(error)) throw error;
      broke = error;
    }
    if (++failures >= tries) throw broke;
    await sleep(backoffMs(failures, o.retry), o.signal);
    if (o.signal?.aborted) throw o.signal.reason;
  }
}

/** The task as it is, then after each change, until it finished (WatchTask). */
export function watchTask(
  tasks: Client<typeof TaskService>,
  taskId: string,
  o: { signal?: AbortSignal; retry?: RetryOptions },
): AsyncGenerator<Task, void, undefined> {
  let last: Task | undefined;
  const open = async function* (signal: AbortSignal | undefined) {
    for await (const res of tasks.watchTask({ taskId }, { signal })) {
      if (!res.task) continue;
      last = res.task;
      yield res.task;
    }
  };
  return reopening(open, { ...o, endedEarly: () => !last || !isFinished(last) });
}

/**
 * The outcome of a task once it finished: resolves when it SUCCEEDED,
 * rejects with TaskFailedError when it FAILED or was CANCELED, with
 * TaskWaitTimeoutError after `timeoutMs`, with the signal's reason when it
 * aborts.
 */
export async function resultOf<R = JsonObject>(
  tasks: Client<typeof TaskService>,
  taskId: string,
  o: WaitOptions & { retry?: RetryOptions },
): Promise<TaskOutcome<R>> {
  if (o.signal?.aborted) throw o.signal.reason;
  const stop = new AbortController();
  let last: Task | undefined;
  const timer =
    o.timeoutMs === undefined
      ? undefined
      : setTimeout(
          () => stop.abort(new TaskWaitTimeoutError(taskId, o.timeoutMs ?? 0, last)),
          o.timeoutMs,
        );
  const onAbort = () => stop.abort(o.signal?.reason);
  o.signal?.addEventListener("abort", onAbort, { once: true });
  try {
    for await (const task of watchTask(tasks, taskId, { signal: stop.signal, retry: o.retry })) {
      last = task;
      if (task.state === TaskState.SUCCEEDED) return outcomeOf<R>(task);
      if (isFinished(task)) throw new TaskFailedError(task);
    }
    // watchTask ends only after a finished task, returned above.
    throw new Error(`the watch of task ${taskId} ended before it finished`);
  } finally {
    clearTimeout(timer);
    o.signal?.removeEventListener("abort", onAbort);
  }
}

/** Options of `tasks.logs()`. */
export interface LogsOptions {
  /** Only lines after this sequence (default: from the oldest kept). */
  afterSequence?: bigint;
  /** Only this attempt's lines. */
  attempt?: number;
  /** Lines per GetTaskLogs call (1–5000, default 1000). */
  pageSize?: number;
  signal?: AbortSignal;
}

/** The kept log lines of a task, oldest first, page after page (GetTaskLogs). */
export async function* pagedLogs(
  tasks: Client<typeof TaskService>,
  taskId: string,
  o: LogsOptions,
): AsyncGenerator<LogLine, void, undefined> {
  let after = o.afterSequence ?? 0n;
  for (;;) {
    const page = await tasks.getTaskLogs(
      { taskId, afterSequence: after, attempt: o.attempt ?? 0, pageSize: o.pageSize ?? 0 },
      { signal: o.signal },
    );
    yield* page.lines;
    if (!page.more || page.nextAfterSequence === after) return;
    after = page.nextAfterSequence;
  }
}

/**
 * The log lines of a task as workers send them, from `afterSequence`, until
 * the task finished and every line was sent (WatchTaskLogs); a broken stream
 * is reopened after the last line seen.
 */
export function followLogs(
  tasks: Client<typeof TaskService>,
  taskId: string,
  o: { afterSequence?: bigint; signal?: AbortSignal; retry?: RetryOptions },
): AsyncGenerator<LogLine, void, undefined> {
  let after = o.afterSequence ?? 0n;
  const open = async function* (signal: AbortSignal | undefined) {
    for await (const res of tasks.watchTaskLogs({ taskId, afterSequence: after }, { signal })) {
      for (const line of res.lines) {
        if (line.sequence > after) after = line.sequence;
        yield line;
      }
    }
  };
  return reopening(open, { ...o, endedEarly: () => false });
}
