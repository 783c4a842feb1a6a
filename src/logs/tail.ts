import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type LogLine, LogLineSchema } from "../../gen/meshwork/v1/task_pb.js";
import type { Config } from "../config.js";
import { invalid } from "../core/errors.js";
import { createWaker } from "../core/signals.js";
import { terminalStates } from "../core/task-sql.js";
import { intInRange, uuidField } from "../core/validate.js";
import { budgeted, createLineBudget, parseLogLine } from "./lines.js";
import type { LogLineRow, LogStore, NewLogLine } from "./store.js";

/** A batch of an AppendLogs stream is written at this many lines, or this long after its first line. */
const batchLines = 100;
const batchMs = 200;

/** How often a watcher re-reads when nothing happened on this replica (lines another replica took). */
const watchRecheckMs = 1000;

/** A subscription to changes of one task; returns the unsubscribe. */
export type Subscribe = (taskId: string, cb: () => void) => () => void;

/** What the log tail uses. */
export interface LogTailDeps {
  store: LogStore;
  config: Pick<Config, "logLinesPerTask" | "logLinesPerSecond">;
}

/** What an append did: lines kept, lines dropped (a lease not held, the rate budget, the cap). */
export interface AppendCounts {
  accepted: number;
  dropped: number;
}

/** A kept line as LogLine (no lease token: reads never show it). */
export function toLogLine(r: LogLineRow): LogLine {
  return create(LogLineSchema, {
    taskId: r.taskId,
    attempt: r.attempt,
    workerId: r.workerId ?? "",
    stream: r.stream,
    text: r.text,
    time: timestampFromDate(r.at),
    sequence: BigInt(r.sequence),
  });
}

/** A sequence as sent (int64), checked. */
function sequenceField(field: string, value: bigint): number {
  if (value < 0n || value > BigInt(Number.MAX_SAFE_INTEGER)) {
    throw invalid(`${field} must be from 0 to ${Number.MAX_SAFE_INTEGER}`);
  }
  return Number(value);
}

/**
 * The log tail of every task: appends (AppendLogs, StreamLeases), pages
 * (GetTaskLogs) and follows (WatchTaskLogs). Lines are a user's data: they
 * go to the database and back to readers, never into the coordinator's log.
 */
export function createLogTail(deps: LogTailDeps) {
  const { store } = deps;
  const cap = deps.config.logLinesPerTask;
  const budget = createLineBudget(deps.config.logLinesPerSecond);
  const watchers = new Map<string, Set<() => void>>();

  /** Stores checked lines (one INSERT), tells this replica's watchers. */
  async function append(lines: NewLogLine[]): Promise<AppendCounts> {
    if (lines.length === 0) return { accepted: 0, dropped: 0 };
    const out = await store.append(budgeted(lines, budget, cap));
    for (const id of out.taskIds) for (const cb of watchers.get(id) ?? []) cb();
    return { accepted: out.accepted, dropped: lines.length - out.accepted };
  }

  /** Calls `cb` after lines of `taskId` are appended on this replica. */
  const subscribe: Subscribe = (taskId, cb) => {
    const set = watchers.get(taskId) ?? new Set();
    watchers.set(taskId, set);
    set.add(cb);
    return () => {
      set.delete(cb);
      if (set.size === 0) watchers.delete(taskId);
    };
  };

  return {
    subscribe,
    append,

    /**
     * AppendLogs: the stream's lines, written in batches (100 lines, or
     * 200 ms after a batch's first line) as they arrive; answered once the
     * stream ended and every batch was written.
     */
    async appendStream(messages: AsyncIterable<LogLine>): Promise<AppendCounts> {
      const total: AppendCounts = { accepted: 0, dropped: 0 };
      let batch: NewLogLine[] = [];
      let writing: Promise<void> = Promise.resolve();
      let failed: unknown;
      let timer: NodeJS.Timeout | undefined;
      const flush = () => {
        clearTimeout(timer);
        timer = undefined;
        const lines = batch;
        batch = [];
        writing = writing.then(async () => {
          if (failed !== undefined || lines.length === 0) return;
          try {
            const n = await append(lines);
            total.accepted += n.accepted;
            total.dropped += n.dropped;
          } catch (error) {
            failed = error;
          }
        });
        return writing;
      };
      let i = 0;
      try {
        for await (const message of messages) {
          if (failed !== undefined) break;
          batch.push(parseLogLine(message, `lines[${i++}].`));
          if (batch.length >= batchLines) await flush();
          else timer ??= setTimeout(flush, batchMs);
        }
        await flush();
      } finally {
        clearTimeout(timer);
      }
      await writing;
      if (failed !== undefined) throw failed;
      return total;
    },

    /** GetTaskLogs: one page after `after_sequence` (page_size 1–5000, default 1000). */
    async page(req: { taskId: string; afterSequence: bigint; pageSize: number; attempt: number }) {
      const taskId = uuidField("task_id", req.taskId);
      const after = sequenceField("after_sequence", req.afterSequence);
      const size = req.pageSize === 0 ? 1000 : intInRange("page_size", req.pageSize, 1, 5000);
      const attempt = intInRange("attempt", req.attempt, 0, 2_000_000_000);
      const page = await store.page(taskId, after, size, attempt);
      const last = page.lines[page.lines.length - 1];
      return {
        lines: page.lines.map(toLogLine),
        nextAfterSequence: BigInt(last ? last.sequence : after),
        dropped: BigInt(page.dropped),
        more: page.more,
      };
    },

    /**
     * WatchTaskLogs: the kept lines after `after_sequence`, then each new
     * batch: woken by appends on this replica and by `wakers` (the task's
     * own changes), re-read every second for other replicas. Ends once the
     * task was terminal before a read that found no further line.
     */
    async *watch(
      req: { taskId: string; afterSequence: bigint },
      signal: AbortSignal,
      wakers: Subscribe[] = [],
    ): AsyncGenerator<{ lines: LogLine[] }> {
      const taskId = uuidField("task_id", req.taskId);
      let after = sequenceField("after_sequence", req.afterSequence);
      const waker = createWaker(signal);
      const unsubscribe = [subscribe, ...wakers].map((s) => s(taskId, waker.wake));
      try {
        while (!signal.aborted) {
          waker.woken();
          // The state is read before the lines: a terminal task takes no more.
          const page = await store.page(taskId, after, 1000);
          const last = page.lines[page.lines.length - 1];
          if (last) {
            after = last.sequence;
            yield { lines: page.lines.map(toLogLine) };
          }
          if (waker.woken() || page.more) continue;
          if (terminalStates.includes(page.state)) return;
          await waker.wait(watchRecheckMs);
        }
      } finally {
        for (const u of unsubscribe) u();
      }
    },
  };
}

export type LogTail = ReturnType<typeof createLogTail>;
