import { toJson } from "@bufbuild/protobuf";
import { type Task, TaskSchema, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import type { Io } from "./args.js";
import { schedulingLines } from "./scheduling-flags.js";
import { record, when } from "./table.js";
import { workflowLines } from "./workflow-flags.js";

// How `meshwork task` shows a task: its state, one JSON line, the lines of
// `task get`, the changes `task watch` prints.

const terminal = new Set([TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED]);

export const stateName = (s: TaskState) => TaskState[s] ?? String(s);
export const json = (t: Task) => JSON.stringify(toJson(TaskSchema, t));

/** A task's progress: "3/10 copying" (steps when the task has them). */
function progressText(p: NonNullable<Task["progress"]>, steps: number | undefined): string {
  return `${p.completedSteps}${steps !== undefined ? `/${steps}` : ""}${p.message ? ` ${p.message}` : ""}`;
}

/** Prints each change of a watched task until it ends; the exit code says how (0 succeeded, 3 otherwise). */
export async function watch(stream: AsyncIterable<{ task?: Task }>, asJson: boolean, io: Io) {
  let last: Task | undefined;
  let lastLine = "";
  for await (const res of stream) {
    const t = res.task;
    if (!t) continue;
    last = t;
    if (asJson) {
      io.out.write(`${json(t)}\n`);
      continue;
    }
    const line = [
      stateName(t.state),
      `attempt ${t.attempt}`,
      t.lease?.workerId && !t.lease.endedAt ? `worker ${t.lease.workerId}` : "",
      t.progress && (t.progress.completedSteps > 0 || t.progress.message)
        ? `progress ${progressText(t.progress, t.steps)}`
        : "",
      t.error ? `error ${t.error.code}: ${t.error.message}` : "",
      t.resultSummary ? `result ${t.resultSummary}` : "",
    ]
      .filter((s) => s !== "")
      .join("  ");
    if (line !== lastLine) io.out.write(`${new Date().toISOString()}  ${line}\n`);
    lastLine = line;
  }
  if (!last || !terminal.has(last.state)) {
    throw new Error("the watch ended before the task did");
  }
  return last.state === TaskState.SUCCEEDED ? 0 : 3;
}

/** One task as aligned "key: value" lines. */
export function describe(t: Task): string {
  const lines: [string, string][] = [
    ["task", t.taskId],
    ["name", t.name || "-"],
    ["workload", t.workload],
    [
      "state",
      `${stateName(t.state)}${t.cancelRequested && t.state !== TaskState.CANCELED ? " (cancel requested)" : ""}`,
    ],
    ["attempt", `${t.attempt} of ${t.maxAttempts}`],
    ["priority", String(t.priority)],
  ];
  if (t.requiredCapabilities.length > 0)
    lines.push(["capabilities", t.requiredCapabilities.join(", ")]);
  const aff = Object.entries(t.affinity);
  if (aff.length > 0) lines.push(["affinity", aff.map(([k, v]) => `${k}=${v}`).join(", ")]);
  lines.push(...schedulingLines(t), ...workflowLines(t, when));
  if (t.parameters) lines.push(["parameters", JSON.stringify(t.parameters)]);
  if (t.input)
    lines.push([
      "input",
      `${t.input.artifactId} (${t.input.sizeBytes} bytes, sha256 ${t.input.sha256})`,
    ]);
  // A lease is shown as live only while it holds; after, when it ended.
  if (t.lease && !t.lease.endedAt)
    lines.push([
      "lease",
      `worker ${t.lease.workerId}, attempt ${t.lease.attempt}, expires ${when(t.lease.expiresAt)}`,
    ]);
  else if (t.lease)
    lines.push([
      "last lease",
      `worker ${t.lease.workerId}, attempt ${t.lease.attempt}, ended ${when(t.lease.endedAt)}`,
    ]);
  if (t.assignedWorkerId)
    lines.push(["assigned", `${t.assignedWorkerId} (${t.assignedApiBaseUrl})`]);
  if (t.progress && (t.progress.completedSteps > 0 || t.progress.message)) {
    lines.push(["progress", progressText(t.progress, t.steps)]);
  }
  if (t.error) lines.push(["error", `${t.error.code}: ${t.error.message}`]);
  if (t.result)
    lines.push([
      "result",
      `${t.result.artifactId} (${t.result.sizeBytes} bytes, sha256 ${t.result.sha256})`,
    ]);
  if (t.resultSummary) lines.push(["summary", t.resultSummary]);
  if (t.correlationId) lines.push(["correlation", t.correlationId]);
  lines.push(["created", when(t.createdAt)], ["updated", when(t.updatedAt)]);
  if (t.startedAt) lines.push(["started", when(t.startedAt)]);
  if (t.finishedAt) lines.push(["finished", when(t.finishedAt)]);
  if (t.deadline) lines.push(["deadline", when(t.deadline)]);
  if (t.notBefore) lines.push(["not before", when(t.notBefore)]);
  return record(lines);
}
