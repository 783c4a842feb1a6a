import { toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { type LogLine, LogLineSchema, TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { endpointOf, endpointOptions, type Io, intFlag, parse, positionalsOf } from "./args.js";
import { transportFor } from "./connect.js";

/** The usage lines of `meshwork task logs` (in `meshwork task --help`). */
export const taskLogsUsage = `'logs' prints the log lines the coordinator keeps for a task (its workers'
  stdout, stderr and messages; the newest --log-lines-per-task lines, 10,000
  by default), oldest first, one per line. -f (--follow) keeps printing new
  lines until the task ends (WatchTaskLogs). --attempt N: that attempt's
  lines only. --json: one LogLine JSON document per line. A count of lines
  dropped (past the cap, or the rate limit) goes to stderr.
`;

/** `meshwork task logs TASK_ID [-f] [--attempt N]`; returns the exit code. */
export async function taskLogs(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {
    ...endpointOptions,
    follow: { type: "boolean", short: "f" },
    attempt: { type: "string" },
  });
  if (values.help) {
    io.out.write(
      `Usage: meshwork task logs TASK_ID [-f] [--attempt N] [--json]\n\n${taskLogsUsage}`,
    );
    return 0;
  }
  const [taskId = ""] = positionalsOf(positionals, ["TASK_ID"]);
  const attempt = intFlag("attempt", values.attempt, 1, 2_000_000_000) ?? 0;
  const tasks = createClient(TaskService, transportFor(endpointOf(values)));
  const print = (lines: LogLine[]) => {
    let out = "";
    for (const l of lines) {
      if (attempt > 0 && l.attempt !== attempt) continue;
      out += values.json ? `${JSON.stringify(toJson(LogLineSchema, l))}\n` : `${l.text}\n`;
    }
    if (out !== "") io.out.write(out);
  };
  let after = 0n;
  let dropped = 0n;
  for (;;) {
    const page = await tasks.getTaskLogs({ taskId, afterSequence: after, attempt, pageSize: 5000 });
    print(page.lines);
    after = page.nextAfterSequence;
    dropped = page.dropped;
    if (!page.more) break;
  }
  if (dropped > 0n) {
    io.err.write(`(${dropped} lines of this task were dropped: past the cap or the rate limit)\n`);
  }
  if (values.follow) {
    for await (const res of tasks.watchTaskLogs({ taskId, afterSequence: after })) print(res.lines);
  }
  return 0;
}
