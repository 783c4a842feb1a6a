import { createHash } from "node:crypto";
import { create, fromJson, type JsonValue, toJson } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import {
  CatchUpPolicy,
  type CreateScheduleRequest,
  OverlapPolicy,
  type Schedule,
  ScheduleSchema,
} from "../../gen/meshwork/v1/schedule_pb.js";
import { type CreateTaskRequest, CreateTaskRequestSchema } from "../../gen/meshwork/v1/task_pb.js";
import { canonicalJson } from "../core/canonical-json.js";
import { invalid } from "../core/errors.js";
import { shareOfCaller } from "../core/scheduling.js";
import { intInRange } from "../core/validate.js";
import { type CreateOrigin, fromCreateRequest } from "../tasks/convert.js";
import type { NewTask } from "../tasks/store.js";
import { type CatchUpName, compileCron, timeZoneField } from "./cron.js";
import type { NewSchedule, ScheduleRow } from "./store.js";

const namePattern = /^[A-Za-z0-9._-]{1,128}$/;

/** Checks a schedule name: 1–128 characters of `[A-Za-z0-9._-]`. */
export function scheduleName(field: string, name: string): string {
  if (!namePattern.test(name)) {
    throw invalid(`${field} must be 1 to 128 characters of [A-Za-z0-9._-]`);
  }
  return name;
}

/** The name or id a request names a schedule by (schedule_id holds either). */
export function scheduleRef(value: string): string {
  if (value === "") throw invalid("schedule_id is required (a schedule's id or name)");
  return scheduleName("schedule_id", value);
}

function overlapOf(p: OverlapPolicy): "SKIP" | "ALLOW" {
  if (p === OverlapPolicy.UNSPECIFIED || p === OverlapPolicy.SKIP) return "SKIP";
  if (p === OverlapPolicy.ALLOW) return "ALLOW";
  throw invalid(`overlap_policy ${p} is not an overlap policy`);
}

function catchUpOf(p: CatchUpPolicy): CatchUpName {
  switch (p) {
    case CatchUpPolicy.UNSPECIFIED:
    case CatchUpPolicy.ONE:
      return "ONE";
    case CatchUpPolicy.SKIP:
      return "SKIP";
    case CatchUpPolicy.ALL:
      return "ALL";
    default:
      throw invalid(`catch_up_policy ${p} is not a catch-up policy`);
  }
}

/**
 * What a template may not hold: what only makes sense in one create call
 * (refs, dependencies), a fixed start time, its own idempotency key (each
 * tick sets one), and inline input bytes (upload them once and name the
 * artifact with input_artifact_id).
 */
function checkTemplate(t: CreateTaskRequest): void {
  if (t.ref !== "") throw invalid("template.ref is not allowed in a schedule's template");
  if (t.dependsOn.length > 0) {
    throw invalid("template.depends_on is not allowed in a schedule's template");
  }
  if (t.idempotencyKey !== "") {
    throw invalid("template.idempotency_key is set by the schedule, one per tick: leave it empty");
  }
  if (t.start.case === "runAt") {
    throw invalid("template.run_at is a fixed time: use template.delay in a schedule");
  }
  if (t.deadline) {
    throw invalid(
      "template.deadline is a fixed time: every task after it would fail at once; use template.timeout_seconds",
    );
  }
  if (t.input.case === "inputData") {
    throw invalid(
      "template.input_data is not allowed: upload the input once and pass template.input_artifact_id",
    );
  }
}

/** The share a schedule's tasks go to unless its template names one, as CreateTask's default. */
export function originOf(createdBy: string, defaultShare: string): CreateOrigin {
  return {
    correlationId: "",
    share: defaultShare || shareOfCaller(createdBy),
    traceparent: "",
    tracestate: "",
  };
}

/**
 * Validates and defaults a CreateScheduleRequest (the template as
 * CreateTask would: a template that could not create a task is refused
 * now, not at its first tick). `now` is the database's clock.
 */
export function fromCreateSchedule(
  req: CreateScheduleRequest,
  createdBy: string,
  defaultShare: string,
  now: Date,
): NewSchedule {
  const name = scheduleName("name", req.name);
  const timeZone = timeZoneField("time_zone", req.timeZone);
  const cron = compileCron(req.cron, timeZone);
  if (!req.template) throw invalid("template is required");
  checkTemplate(req.template);
  fromCreateRequest(req.template, originOf(createdBy, defaultShare), "template.");
  const template = toJson(CreateTaskRequestSchema, req.template) as Record<string, unknown>;
  const catchUpLimit =
    req.catchUpLimit === undefined ? 10 : intInRange("catch_up_limit", req.catchUpLimit, 1, 1000);
  const normalised = {
    cron: req.cron.trim(),
    timeZone,
    template,
    overlapPolicy: overlapOf(req.overlapPolicy),
    catchUpPolicy: catchUpOf(req.catchUpPolicy),
    catchUpLimit,
    paused: req.paused,
  };
  return {
    name,
    ...normalised,
    nextRunAt: req.paused ? null : (cron.nextRun(now) ?? null),
    requestHash: createHash("sha256").update(canonicalJson(normalised)).digest("hex"),
    createdBy,
    inputArtifactId: req.template.input.case === "inputArtifactId" ? req.template.input.value : "",
  };
}

/** A stored template as the CreateTaskRequest it was given as. */
export function templateOf(row: Pick<ScheduleRow, "template">): CreateTaskRequest {
  return fromJson(CreateTaskRequestSchema, row.template as JsonValue);
}

/**
 * The task one tick creates: the template, in the share of the schedule's
 * creator unless it names one, with the tick's idempotency key (a repeat of
 * the same tick finds the task made before) and the schedule's id.
 */
export function taskOfTick(
  row: ScheduleRow,
  tick: Date | null,
  defaultShare: string,
): { req: CreateTaskRequest; task: NewTask } {
  const req = templateOf(row);
  const task = fromCreateRequest(req, originOf(row.createdBy, defaultShare), "template.");
  task.idempotencyKey = tick ? tickKey(row.id, tick) : null;
  task.scheduleId = row.id;
  return { req, task };
}

/** The idempotency key of a tick's task: `schedule:<schedule_id>:<tick, ISO 8601>`. */
export function tickKey(scheduleId: string, tick: Date): string {
  return `schedule:${scheduleId}:${tick.toISOString()}`;
}

const ts = (d: Date | null) => (d ? timestampFromDate(d) : undefined);

/** The public form of a schedule. */
export function toSchedule(row: ScheduleRow): Schedule {
  return create(ScheduleSchema, {
    scheduleId: row.id,
    name: row.name,
    cron: row.cron,
    timeZone: row.timeZone,
    template: templateOf(row),
    overlapPolicy: OverlapPolicy[row.overlapPolicy],
    catchUpPolicy: CatchUpPolicy[row.catchUpPolicy],
    paused: row.paused,
    nextRunAt: ts(row.nextRunAt),
    lastRunAt: ts(row.lastRunAt),
    lastTaskId: row.lastTaskId ?? "",
    catchUpLimit: row.catchUpLimit,
    createdAt: ts(row.createdAt),
  });
}
