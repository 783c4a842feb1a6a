import type { JsonObject } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import {
  CatchUpPolicy,
  OverlapPolicy,
  type Schedule,
  type ScheduleService,
} from "../../gen/meshwork/v1/schedule_pb.js";
import type { Task } from "../../gen/meshwork/v1/task_pb.js";
import { createRequest, type TaskSpec } from "./convert.js";
import type { CallOptions } from "./tasks.js";

/** A schedule to create: a name, a cron expression and the task each tick creates. */
export interface ScheduleSpec<P extends object = JsonObject> {
  /** Unique among schedules (1–128 characters of `[A-Za-z0-9._-]`). */
  name: string;
  /** 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or `@hourly`, `@daily`, … */
  cron: string;
  /** The IANA time zone the expression is read in, e.g. `Europe/Paris` (default UTC). */
  timeZone?: string;
  /**
   * The task each tick creates. Its idempotency key is the schedule's
   * (`schedule:<id>:<tick>`), so `idempotencyKey` is ignored; `ref` and
   * `dependsOn` are not allowed.
   */
  task: Omit<TaskSpec<P>, "idempotencyKey">;
  /** What a tick does while the last task is still live: `"skip"` (default) or `"allow"`. */
  overlap?: "skip" | "allow";
  /**
   * The ticks missed while no coordinator ran: `"one"` task for all of them
   * (default), `"skip"` them, or `"all"` (at most `catchUpLimit`, default 10).
   */
  catchUp?: "skip" | "one" | "all";
  catchUpLimit?: number;
  /** Creates the schedule paused. */
  paused?: boolean;
}

/** `client.schedules`: cron schedules that create tasks (ScheduleService). Each takes an id or a name. */
export interface SchedulesApi {
  /** Creates a schedule; the same name with the same request returns the existing one. */
  create<P extends object = JsonObject>(
    spec: ScheduleSpec<P>,
    options?: CallOptions,
  ): Promise<Schedule>;
  get(idOrName: string, options?: CallOptions): Promise<Schedule>;
  /** Every schedule, by name, read a page at a time as iterated. */
  list(options?: CallOptions & { pageSize?: number }): AsyncIterable<Schedule>;
  /** Stops its ticks until resumed. */
  pause(idOrName: string, options?: CallOptions): Promise<Schedule>;
  /** Starts its ticks again from now (the ticks missed while paused are not caught up). */
  resume(idOrName: string, options?: CallOptions): Promise<Schedule>;
  /** Removes it; the tasks it created stay. */
  delete(idOrName: string, options?: CallOptions): Promise<void>;
  /** Creates one task from its template now, outside its ticks. */
  trigger(idOrName: string, options?: CallOptions): Promise<Task>;
}

export function createSchedulesApi(rpc: Client<typeof ScheduleService>): SchedulesApi {
  return {
    async create(spec, options) {
      const res = await rpc.createSchedule(
        {
          name: spec.name,
          cron: spec.cron,
          timeZone: spec.timeZone ?? "",
          template: createRequest({ ...spec.task, idempotencyKey: false }),
          overlapPolicy: spec.overlap === "allow" ? OverlapPolicy.ALLOW : OverlapPolicy.SKIP,
          catchUpPolicy:
            spec.catchUp === "skip"
              ? CatchUpPolicy.SKIP
              : spec.catchUp === "all"
                ? CatchUpPolicy.ALL
                : CatchUpPolicy.ONE,
          catchUpLimit: spec.catchUpLimit,
          paused: spec.paused ?? false,
        },
        options,
      );
      return required(res.schedule);
    },
    async get(idOrName, options) {
      return required((await rpc.getSchedule({ scheduleId: idOrName }, options)).schedule);
    },
    async *list(options = {}) {
      const { pageSize, ...call } = options;
      let pageToken = "";
      do {
        const page = await rpc.listSchedules({ pageSize: pageSize ?? 0, pageToken }, call);
        yield* page.schedules;
        pageToken = page.nextPageToken;
      } while (pageToken);
    },
    async pause(idOrName, options) {
      return required((await rpc.pauseSchedule({ scheduleId: idOrName }, options)).schedule);
    },
    async resume(idOrName, options) {
      return required((await rpc.resumeSchedule({ scheduleId: idOrName }, options)).schedule);
    },
    async delete(idOrName, options) {
      await rpc.deleteSchedule({ scheduleId: idOrName }, options);
    },
    async trigger(idOrName, options) {
      const { task } = await rpc.triggerSchedule({ scheduleId: idOrName }, options);
      if (!task) throw new Error("the coordinator answered without a task");
      return task;
    },
  };
}

function required(schedule: Schedule | undefined): Schedule {
  if (!schedule) throw new Error("the coordinator answered without a schedule");
  return schedule;
}
