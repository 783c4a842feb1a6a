import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { DeliveryState, DependencyPolicy, type Task } from "../../gen/meshwork/v1/task_pb.js";
import { parseDuration } from "../config.js";
import { UsageError } from "./args.js";

// The workflow flags of `meshwork task create` (docs/workflows.md): when a
// task may start, what it waits for, how long an attempt may run; and how
// `meshwork task get` shows them.

/** The flags, for parseArgs. */
export const workflowOptions = {
  at: { type: "string" },
  in: { type: "string" },
  "depends-on": { type: "string", multiple: true },
  "all-done": { type: "boolean" },
  timeout: { type: "string" },
  dispatch: { type: "boolean" },
  "no-dispatch": { type: "boolean" },
} as const;

/** A duration flag: `90s`, `5m`, `2h`, `1d` (parseDuration). */
function durationMs(flag: string, text: string): number {
  const ms = parseDuration(text);
  if (Number.isNaN(ms)) {
    throw new UsageError(
      `--${flag} takes a whole number with a unit (90s, 5m, 2h, 1d), not ${JSON.stringify(text)}`,
    );
  }
  return ms;
}

/** The workflow fields of a CreateTaskRequest from the flags. */
export function workflowRequest(values: {
  at?: string | undefined;
  in?: string | undefined;
  "depends-on"?: string[] | undefined;
  "all-done"?: boolean | undefined;
  timeout?: string | undefined;
  dispatch?: boolean | undefined;
  "no-dispatch"?: boolean | undefined;
}) {
  if (values.at !== undefined && values.in !== undefined) {
    throw new UsageError("give --at or --in, not both");
  }
  if (values.dispatch && values["no-dispatch"]) {
    throw new UsageError("give --dispatch or --no-dispatch, not both");
  }
  let start:
    | { case: "runAt"; value: ReturnType<typeof timestampFromDate> }
    | { case: "delay"; value: ReturnType<typeof durationFromMs> }
    | { case: undefined } = { case: undefined };
  if (values.at !== undefined) {
    const d = new Date(values.at);
    if (Number.isNaN(d.getTime())) {
      throw new UsageError(`--at must be an ISO 8601 time, not ${JSON.stringify(values.at)}`);
    }
    start = { case: "runAt", value: timestampFromDate(d) };
  } else if (values.in !== undefined) {
    start = { case: "delay", value: durationFromMs(durationMs("in", values.in)) };
  }
  return {
    start,
    dependsOn: (values["depends-on"] ?? []).flatMap((d) => d.split(",")).filter((d) => d !== ""),
    dependencyPolicy: values["all-done"]
      ? DependencyPolicy.ALL_DONE
      : DependencyPolicy.ALL_SUCCEEDED,
    timeoutSeconds:
      values.timeout === undefined
        ? undefined
        : Math.round(durationMs("timeout", values.timeout) / 1000),
    // Unset: the coordinator's --dispatch-default.
    dispatch: values.dispatch ? true : values["no-dispatch"] ? false : undefined,
  };
}

/** `meshwork task get` lines for the workflow fields that are set. */
export function workflowLines(t: Task, when: (ts: Task["runAt"]) => string): [string, string][] {
  const lines: [string, string][] = [];
  if (t.ref) lines.push(["ref", t.ref]);
  if (t.dependsOn.length > 0) {
    const policy = t.dependencyPolicy === DependencyPolicy.ALL_DONE ? "all done" : "all succeeded";
    lines.push([
      "depends on",
      `${t.dependsOn.join(", ")} (${policy}; ${t.dependenciesPending} pending)`,
    ]);
  }
  for (const [name, id] of Object.entries(t.dependencyOutputs).sort())
    lines.push(["dependency output", `${name} → ${id}`]);
  if (t.runAt) lines.push(["run at", when(t.runAt)]);
  if (t.timeoutSeconds > 0) lines.push(["timeout", `${t.timeoutSeconds} s per attempt`]);
  if (t.scheduleId) lines.push(["schedule", t.scheduleId]);
  if (t.resultValue) lines.push(["result value", JSON.stringify(t.resultValue)]);
  if (t.dispatch) lines.push(["dispatch", deliveryLine(t)]);
  return lines;
}

/** How the coordinator's delivery of the current attempt stands (docs/protocol.md#push-placement). */
export function deliveryLine(t: Task): string {
  const d = t.delivery;
  if (!d) return "on (not placed yet)";
  const state = DeliveryState[d.state]?.toLowerCase() ?? "unknown";
  const last =
    d.lastStatus > 0 ? `, last answer ${d.lastStatus}` : d.lastError ? `, ${d.lastError}` : "";
  return `${state} to worker ${d.workerId}, attempt ${d.attempt}, ${d.tries} request(s)${last}`;
}
