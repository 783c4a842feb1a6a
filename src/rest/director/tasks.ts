import type { JsonObject } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { DependencyPolicy, TaskState, WaitKind } from "../../../gen/meshwork/v1/task_pb.js";
import { invalid } from "../../core/errors.js";
import type { PlainRoute } from "../../http/routes.js";
import { field } from "../body.js";
import { type DirectorRoute, orNull, required0, statusName } from "./session.js";

const taskFields = [
  "name",
  "workload",
  "steps",
  "requiredBrickIds",
  "affinity",
  "priority",
  "deadlineUtc",
  "parameters",
  "idempotencyKey",
  "correlationId",
  "maxAttempts",
  "leaseSeconds",
  "inputArtifactId",
  "resources",
  "requirements",
  "preferences",
  "share",
  "concurrencyKey",
  "rateKey",
  "runAtUtc",
  "delaySeconds",
  "dependsOn",
  "dependencyPolicy",
  "timeoutSeconds",
  "dispatch",
];
const placementFields = ["scheduleIdempotencyKey", "correlationId", "leaseSeconds"];

/** The task routes: list, create, read, and push placement (schedule, retry). */
export function taskRoutes(route: DirectorRoute): PlainRoute[] {
  return [
    route(["GET"], "/tasks", ["TaskService/ListTasks"], "list tasks", async (s, req) => {
      const query = new URL(req.url ?? "/", "http://x").searchParams;
      const status = query.get("status");
      const state = status ? stateOfStatus(status) : TaskState.UNSPECIFIED;
      const pageSizeText = query.get("pageSize");
      const page = await s.tasks.listTasks({
        state,
        workload: query.get("workload") ?? "",
        correlationId: query.get("correlationId") ?? "",
        // 0 would mean "the default" to the RPC: here it is out of range, as documented.
        pageSize: pageSizeText === null ? 0 : queryInt("pageSize", pageSizeText, 1),
        pageToken: query.get("pageToken") ?? "",
      });
      return [
        200,
        {
          tasks: await Promise.all(page.tasks.map(s.taskJson)),
          nextPageToken: orNull(page.nextPageToken),
        },
      ];
    }),

    route(["POST"], "/tasks", ["TaskService/CreateTask"], "create a task", async (s, _req) => {
      const body = await s.json(taskFields);
      const required = field.strings(body, "requiredBrickIds") ?? [];
      const workload = field.string(body, "workload") ?? required[0];
      if (!workload) throw invalid("requiredBrickIds (or workload) must name what runs the task");
      const deadline = field.time(body, "deadlineUtc");
      const inputArtifactId = field.string(body, "inputArtifactId");
      const { task } = await s.tasks.createTask({
        name: field.string(body, "name") ?? "",
        workload,
        requiredCapabilities: required,
        affinity: field.stringMap(body, "affinity") ?? {},
        priority: field.int(body, "priority") ?? 0,
        deadline: deadline && timestampFromDate(deadline),
        parameters: field.object(body, "parameters") as JsonObject | undefined,
        steps: field.int(body, "steps"),
        maxAttempts: field.int(body, "maxAttempts"),
        leaseSeconds: field.int(body, "leaseSeconds"),
        idempotencyKey: field.string(body, "idempotencyKey") ?? "",
        correlationId: field.string(body, "correlationId") ?? "",
        input: inputArtifactId
          ? { case: "inputArtifactId", value: inputArtifactId }
          : { case: undefined },
        resources: field.quantities(body, "resources") ?? {},
        requirements: field.requirements(body, "requirements") ?? [],
        preferences: field.preferences(body, "preferences") ?? [],
        share: field.string(body, "share") ?? "",
        concurrencyKey: field.string(body, "concurrencyKey") ?? "",
        rateKey: field.string(body, "rateKey") ?? "",
        start: startOf(field.time(body, "runAtUtc"), field.int(body, "delaySeconds")),
        dependsOn: field.strings(body, "dependsOn") ?? [],
        dependencyPolicy: policyOf(field.string(body, "dependencyPolicy")),
        timeoutSeconds: field.int(body, "timeoutSeconds"),
        dispatch: field.bool(body, "dispatch"),
      });
      return [200, await s.taskJson(required0(task))];
    }),

    route(["GET"], "/tasks/{id}", ["TaskService/GetTask"], "read a task", async (s, _req, m) => {
      const { task, waiting, queuePosition } = await s.tasks.getTask({ taskId: m[1] ?? "" });
      return [
        200,
        {
          ...(await s.taskJson(required0(task))),
          // Why a Pending task waits (GetTaskResponse.waiting), and its place in its share.
          waiting: waiting.map((w) => ({
            kind: WaitKind[w.kind],
            message: w.message,
            detail: Object.fromEntries(Object.entries(w.detail).map(([k, v]) => [k, Number(v)])),
          })),
          queuePosition,
        },
      ];
    }),

    ...(["schedule", "retry"] as const).map((op) =>
      route(
        ["POST"],
        `/tasks/{id}/${op}`,
        [op === "schedule" ? "TaskService/ScheduleTask" : "TaskService/RetryTask"],
        `${op} a task`,
        async (s, _req, m) => {
          const body = await s.json(placementFields, { optional: true });
          const placement = {
            taskId: m[1] ?? "",
            scheduleIdempotencyKey: field.string(body, "scheduleIdempotencyKey") ?? "",
            correlationId: field.string(body, "correlationId") ?? "",
            leaseSeconds: field.int(body, "leaseSeconds"),
          };
          const { task } =
            op === "schedule"
              ? await s.tasks.scheduleTask(placement)
              : await s.tasks.retryTask(placement);
          return [200, await s.taskJson(required0(task))];
        },
      ),
    ),
  ];
}

/** A `status` query value (a director status name, any case) as a task state. */
function stateOfStatus(status: string): TaskState {
  for (const [state, name] of Object.entries(statusName)) {
    if (name && name.toLowerCase() === status.toLowerCase()) return Number(state) as TaskState;
  }
  throw invalid(`status must be one of Pending, Assigned, Running, Succeeded, Failed, Canceled`);
}

/** When a task may start: `runAtUtc` or `delaySeconds` (the RPC checks the range), not both. */
function startOf(runAt: Date | undefined, delaySeconds: number | undefined) {
  if (runAt && delaySeconds !== undefined) throw invalid("give runAtUtc or delaySeconds, not both");
  if (runAt) return { case: "runAt" as const, value: timestampFromDate(runAt) };
  if (delaySeconds !== undefined) {
    return { case: "delay" as const, value: durationFromMs(delaySeconds * 1000) };
  }
  return { case: undefined };
}

/** A `dependencyPolicy` as the director spells it (AllSucceeded, AllDone; or the enum's name). */
function policyOf(text: string | undefined): DependencyPolicy {
  if (text === undefined) return DependencyPolicy.UNSPECIFIED;
  const key = text
    .replace(/^DEPENDENCY_POLICY_/i, "")
    .replace(/[_-]/g, "")
    .toLowerCase();
  if (key === "allsucceeded") return DependencyPolicy.ALL_SUCCEEDED;
  if (key === "alldone") return DependencyPolicy.ALL_DONE;
  throw invalid("dependencyPolicy must be AllSucceeded or AllDone");
}

function queryInt(name: string, text: string, min: number): number {
  if (!/^\d{1,9}$/.test(text) || Number(text) < min) {
    throw invalid(`${name} must be a whole number, at least ${min}`);
  }
  return Number(text);
}
