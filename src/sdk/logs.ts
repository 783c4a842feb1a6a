import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { type Client, Code, ConnectError } from "@connectrpc/connect";
import type { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { type LogLine, LogLineSchema } from "../../gen/meshwork/v1/task_pb.js";
import { backoffMs, isTransient } from "./rpc.js";

/** Where a line came from: the command's stdout or stderr, or the handler's own message. */
export type LogStreamName = "stdout" | "stderr" | "log";

/** The lease lines are sent under. */
export interface LogLease {
  taskId: string;
  attempt: number;
  workerId: string;
  leaseToken: string;
}

/**
 * Ships a worker's task log lines with AppendLogs: buffered, sent in
 * batches (every 250 ms, at most 500 lines a call), before each completion
 * (`flush`). Lines are best effort: at most 10,000 wait (the oldest are
 * dropped past it), a transient failure is retried after a backoff, and a
 * coordinator that refuses them (an older one: `unimplemented`) is told
 * once in the worker's log and sent no more.
 */
export interface LogShipper {
  /** Queues `text`, one line per line of it. */
  write(lease: LogLease, stream: LogStreamName, text: string): void;
  /** Sends what is queued; resolves when sent or given up. */
  flush(): Promise<void>;
}

const batchMs = 250;
const maxBatch = 500;
const maxQueued = 10_000;

export function createLogShipper(options: {
  client: Client<typeof LeaseService>;
  log: (message: string) => void;
  timeoutMs: number;
}): LogShipper {
  const { client, log } = options;
  let queue: LogLine[] = [];
  let timer: NodeJS.Timeout | undefined;
  let sending: Promise<void> | undefined;
  let failures = 0;
  let off = false;
  let droppedNoted = false;

  const sendOnce = async (): Promise<boolean> => {
    const batch = queue.slice(0, maxBatch);
    if (batch.length === 0 || off) return false;
    try {
      await client.appendLogs(
        (async function* () {
          yield* batch;
        })(),
        { timeoutMs: options.timeoutMs },
      );
      queue = queue.slice(batch.length);
      failures = 0;
      return queue.length > 0;
    } catch (error) {
      if (isTransient(error) && failures < 5) {
        failures++;
        await new Promise((r) => setTimeout(r, backoffMs(failures)).unref());
        return true;
      }
      const refused = error instanceof ConnectError && error.code === Code.Unimplemented;
      if (refused) off = true;
      log(
        refused
          ? "the coordinator does not take task logs (AppendLogs); they are not sent"
          : `sending ${batch.length} task log lines failed (${(error as Error).message}); dropped`,
      );
      queue = queue.slice(batch.length);
      failures = 0;
      return queue.length > 0;
    }
  };

  const drain = (): Promise<void> => {
    clearTimeout(timer);
    timer = undefined;
    sending ??= (async () => {
      try {
        while (await sendOnce());
      } finally {
        sending = undefined;
      }
    })();
    return sending;
  };

  return {
    write(lease, stream, text) {
      if (off) return;
      const lines = text.replace(/\r?\n$/, "").split(/\r?\n/);
      const time = timestampNow();
      for (const line of lines) {
        // U+0000 is refused by the coordinator (PostgreSQL cannot store it).
        queue.push(
          create(LogLineSchema, { ...lease, stream, text: line.replaceAll("\0", "\uFFFD"), time }),
        );
      }
      if (queue.length > maxQueued) {
        queue = queue.slice(queue.length - maxQueued);
        if (!droppedNoted) {
          droppedNoted = true;
          log(`more than ${maxQueued} task log lines waiting to be sent; the oldest are dropped`);
        }
      }
      if (!timer && !sending) {
        timer = setTimeout(() => void drain(), batchMs);
        timer.unref();
      }
    },
    async flush() {
      if (sending) await sending;
      if (queue.length > 0) await drain();
    },
  };
}
