import { create as createMessage, toJson } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import {
  GetTaskResponseSchema,
  type Task,
  TaskSchema,
  TaskService,
  TaskState,
} from "../../gen/meshwork/v1/task_pb.js";
import {
  endpointOf,
  endpointOptions,
  type Io,
  intFlag,
  pairs,
  parameterObject,
  parse,
  positionalsOf,
  runCommand,
  stdio,
  UsageError,
} from "./args.js";
import { uploadInput } from "./artifact.js";
import { transportFor } from "./connect.js";
import { workerIdOf } from "./resolve.js";
import { preferenceFlag, quantities, requirementFlag, waitingText } from "./scheduling-flags.js";
import { unknownSubcommand } from "./suggest.js";
import { ago, table } from "./table.js";
import { taskLogs } from "./task-logs.js";
import { usage } from "./task-usage.js";
import { describe, json, stateName, watch } from "./task-view.js";
import { workflowOptions, workflowRequest } from "./workflow-flags.js";

const states: Record<string, TaskState> = {
  pending: TaskState.PENDING,
  assigned: TaskState.ASSIGNED,
  running: TaskState.RUNNING,
  succeeded: TaskState.SUCCEEDED,
  failed: TaskState.FAILED,
  canceled: TaskState.CANCELED,
  cancelled: TaskState.CANCELED,
};

/** `meshwork task …`; returns the exit code. */
export async function taskCommand(argv: string[], io: Io = stdio): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    (sub === undefined ? io.err : io.out).write(usage);
    return sub === undefined ? 2 : 0;
  }
  const prefix = `meshwork task ${sub}`;
  return runCommand(prefix, io, async () => {
    switch (sub) {
      case "create":
        return create(rest, io);
      case "get":
      case "why":
      case "retry":
      case "watch":
        return one(sub, rest, io);
      case "cancel":
      case "rerun":
        return bulk(sub, rest, io);
      case "list":
        return list(rest, io);
      case "logs":
        return taskLogs(rest, io);
      default:
        throw unknownSubcommand(
          sub,
          ["create", "get", "why", "list", "cancel", "rerun", "retry", "watch", "logs"],
          "meshwork task",
        );
    }
  });
}

async function create(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {
    ...endpointOptions,
    workload: { type: "string" },
    name: { type: "string" },
    param: { type: "string", multiple: true },
    params: { type: "string" },
    input: { type: "string" },
    "input-artifact": { type: "string" },
    capability: { type: "string", multiple: true },
    affinity: { type: "string", multiple: true },
    priority: { type: "string" },
    "max-attempts": { type: "string" },
    "lease-seconds": { type: "string" },
    steps: { type: "string" },
    deadline: { type: "string" },
    "idempotency-key": { type: "string" },
    resources: { type: "string", multiple: true },
    require: { type: "string", multiple: true },
    prefer: { type: "string", multiple: true },
    share: { type: "string" },
    "concurrency-key": { type: "string" },
    "rate-key": { type: "string" },
    ...workflowOptions,
  });
  if (values.help) return help(io);
  positionalsOf(positionals, []);
  if (!values.workload) throw new UsageError("--workload is required");
  if (values.input !== undefined && values["input-artifact"] !== undefined) {
    throw new UsageError("give --input or --input-artifact, not both");
  }
  const parameters = parameterObject(values.params, values.param ?? []);
  const affinity = pairs("affinity", values.affinity ?? []);
  const deadline = timeFlag("deadline", values.deadline);
  const request = {
    workload: values.workload,
    name: values.name ?? "",
    parameters,
    requiredCapabilities: values.capability ?? [],
    affinity,
    priority: intFlag("priority", values.priority, -2147483648, 2147483647) ?? 0,
    maxAttempts: intFlag("max-attempts", values["max-attempts"], 1, 100),
    leaseSeconds: intFlag("lease-seconds", values["lease-seconds"], 5, 86400),
    steps: intFlag("steps", values.steps, 0, 2147483647),
    deadline: deadline ? timestampFromDate(deadline) : undefined,
    idempotencyKey: values["idempotency-key"] ?? "",
    resources: quantities("resources", values.resources ?? []),
    requirements: (values.require ?? []).map(requirementFlag),
    preferences: (values.prefer ?? []).map(preferenceFlag),
    share: values.share ?? "",
    concurrencyKey: values["concurrency-key"] ?? "",
    rateKey: values["rate-key"] ?? "",
    ...workflowRequest(values),
  };
  const endpoint = endpointOf(values);
  let inputArtifactId = values["input-artifact"];
  if (values.input !== undefined) {
    inputArtifactId = (await uploadInput(endpoint, values.input)).artifactId;
  }
  const tasks = createClient(TaskService, transportFor(endpoint));
  const res = await tasks.createTask({
    ...request,
    input: inputArtifactId
      ? { case: "inputArtifactId", value: inputArtifactId }
      : { case: undefined },
  });
  const task = res.task;
  if (!task) throw new Error("the coordinator answered without the task");
  if (values.json) {
    io.out.write(`${json(task)}\n`);
  } else {
    io.out.write(`${task.taskId}\n`);
    io.err.write(
      `created task ${task.taskId} (${task.workload}${task.name ? `, ${task.name}` : ""}), ${stateName(task.state)}${task.input ? `, input ${task.input.artifactId}` : ""}\n`,
    );
  }
  return 0;
}

/** An ISO 8601 time flag, or undefined when absent. */
function timeFlag(name: string, value: string | undefined): Date | undefined {
  if (value === undefined) return undefined;
  const d = new Date(value);
  if (Number.isNaN(d.getTime())) {
    throw new UsageError(`--${name} must be an ISO 8601 time, not ${JSON.stringify(value)}`);
  }
  return d;
}

/**
 * `task cancel` and `task rerun`: one task by id (CancelTask, RerunTask), or
 * every task that several ids or a filter match (CancelTasks, RerunTasks).
 */
async function bulk(sub: "cancel" | "rerun", args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {
    ...endpointOptions,
    reason: { type: "string" },
    state: { type: "string", multiple: true },
    workload: { type: "string" },
    "created-after": { type: "string" },
    "created-before": { type: "string" },
    "dry-run": { type: "boolean" },
    dependents: { type: "boolean" },
  });
  if (values.help) return help(io);
  if (sub === "rerun" && values.reason !== undefined) throw new UsageError("unknown flag --reason");
  if (values.dependents && (sub !== "rerun" || positionals.length !== 1)) {
    throw new UsageError(
      "--dependents takes one task to rerun: meshwork task rerun TASK_ID --dependents",
    );
  }
  const actsOn =
    sub === "cancel"
      ? [TaskState.PENDING, TaskState.ASSIGNED, TaskState.RUNNING]
      : [TaskState.FAILED, TaskState.CANCELED];
  const filterStates = (values.state ?? []).map((name) => {
    const st = states[name.toLowerCase()];
    if (st === undefined || !actsOn.includes(st)) {
      throw new UsageError(
        `--state must be one of ${actsOn.map((x) => stateName(x).toLowerCase()).join(", ")}, not ${JSON.stringify(name)}`,
      );
    }
    return st;
  });
  const after = timeFlag("created-after", values["created-after"]);
  const before = timeFlag("created-before", values["created-before"]);
  const filtered = filterStates.length > 0 || values.workload !== undefined || after || before;
  if (positionals.length === 0 && !filtered) {
    throw new UsageError(
      "give TASK_ID... or a filter (--state, --workload, --created-after, --created-before)",
    );
  }
  const tasks = createClient(TaskService, transportFor(endpointOf(values)));
  const [only] = positionals;
  if (only !== undefined && positionals.length === 1 && !filtered && !values["dry-run"]) {
    const res =
      sub === "cancel"
        ? await tasks.cancelTask({ taskId: only, reason: values.reason ?? "" })
        : await tasks.rerunTask({ taskId: only, rerunDependents: values.dependents === true });
    const task = res.task;
    if (!task) throw new Error("the coordinator answered without the task");
    if (values.json) io.out.write(`${json(task)}\n`);
    else io.out.write(`task ${task.taskId} is ${stateName(task.state)}\n`);
    return 0;
  }
  const filter = {
    states: filterStates,
    workload: values.workload ?? "",
    taskIds: positionals,
    createdAfter: after ? timestampFromDate(after) : undefined,
    createdBefore: before ? timestampFromDate(before) : undefined,
  };
  const dryRun = values["dry-run"] === true;
  const { count } =
    sub === "cancel"
      ? await tasks.cancelTasks({ filter, dryRun, reason: values.reason ?? "" })
      : await tasks.rerunTasks({ filter, dryRun });
  const verb = sub === "cancel" ? "cancel" : "rerun";
  if (values.json) io.out.write(`${JSON.stringify({ count, dryRun })}\n`);
  else if (dryRun) io.out.write(`${count} tasks match: a ${verb} would act on them (dry run)\n`);
  else io.out.write(`${sub === "cancel" ? "cancelled" : "reran"} ${count} tasks\n`);
  return 0;
}

async function one(sub: "get" | "why" | "retry" | "watch", args: string[], io: Io) {
  const { values, positionals } = parse(args, {
    ...endpointOptions,
    "lease-seconds": { type: "string" },
    "idempotency-key": { type: "string" },
  });
  if (values.help) return help(io);
  const [taskId = ""] = positionalsOf(positionals, ["TASK_ID"]);
  const allowed: Record<string, string[]> = {
    retry: ["lease-seconds", "idempotency-key"],
  };
  for (const flag of ["lease-seconds", "idempotency-key"] as const) {
    if (values[flag] !== undefined && !allowed[sub]?.includes(flag)) {
      throw new UsageError(`unknown flag --${flag}`);
    }
  }
  const tasks = createClient(TaskService, transportFor(endpointOf(values)));
  if (sub === "watch") return watch(tasks.watchTask({ taskId }), values.json === true, io);
  if (sub === "why") {
    const { waiting, queuePosition } = await tasks.getTask({ taskId });
    if (values.json) {
      io.out.write(
        `${JSON.stringify(toJson(GetTaskResponseSchema, createMessage(GetTaskResponseSchema, { waiting, queuePosition })))}\n`,
      );
    } else io.out.write(waitingText(waiting, queuePosition));
    return 0;
  }
  const res =
    sub === "get"
      ? await tasks.getTask({ taskId })
      : await tasks.retryTask({
          taskId,
          leaseSeconds: intFlag("lease-seconds", values["lease-seconds"], 60, 86400),
          scheduleIdempotencyKey: values["idempotency-key"] ?? "",
        });
  const task = res.task;
  if (!task) throw new Error("the coordinator answered without the task");
  if (values.json) io.out.write(`${json(task)}\n`);
  else if (sub === "get") io.out.write(describe(task));
  else {
    io.out.write(
      `task ${task.taskId} is ${stateName(task.state)} on worker ${task.assignedWorkerId} (${task.assignedApiBaseUrl}), attempt ${task.attempt}; ${task.dispatch ? "the coordinator delivers it there" : "dispatch it there (lease token with --json)"}\n`,
    );
  }
  return 0;
}

async function list(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {
    ...endpointOptions,
    state: { type: "string" },
    workload: { type: "string" },
    worker: { type: "string" },
    limit: { type: "string" },
  });
  if (values.help) return help(io);
  positionalsOf(positionals, []);
  let state = TaskState.UNSPECIFIED;
  if (values.state !== undefined) {
    const s = states[values.state.toLowerCase()];
    if (s === undefined) {
      throw new UsageError(
        `--state must be one of pending, assigned, running, succeeded, failed, canceled, not ${JSON.stringify(values.state)}`,
      );
    }
    state = s;
  }
  const limit = intFlag("limit", values.limit, 1, 10000) ?? 100;
  const transport = transportFor(endpointOf(values));
  const tasks = createClient(TaskService, transport);
  const workerId = values.worker === undefined ? "" : await workerIdOf(transport, values.worker);
  const rows: Task[] = [];
  let pageToken = "";
  do {
    const res = await tasks.listTasks({
      pageSize: Math.min(1000, limit - rows.length),
      pageToken,
      state,
      workload: values.workload ?? "",
      workerId,
    });
    rows.push(...res.tasks.slice(0, limit - rows.length));
    pageToken = res.nextPageToken;
  } while (pageToken !== "" && rows.length < limit);
  if (values.json) {
    io.out.write(`${JSON.stringify({ tasks: rows.map((t) => toJson(TaskSchema, t)) })}\n`);
    return 0;
  }
  io.out.write(
    table(
      ["ID", "STATE", "WORKLOAD", "NAME", "ATTEMPT", "WORKER", "CREATED", "UPDATED"],
      rows.map((t) => [
        t.taskId,
        stateName(t.state),
        t.workload,
        t.name || "-",
        `${t.attempt}/${t.maxAttempts}`,
        t.lease?.workerId || t.assignedWorkerId || "-",
        ago(t.createdAt),
        ago(t.updatedAt),
      ]),
    ),
  );
  return 0;
}

function help(io: Io): number {
  io.out.write(usage);
  return 0;
}
