import { randomUUID } from "node:crypto";
import type { ServiceImpl } from "@connectrpc/connect";
import type { ScheduleService } from "../../gen/meshwork/v1/schedule_pb.js";
import type { ArtifactStore } from "../artifacts/store.js";
import { callerOf } from "../auth/principal.js";
import { invalid } from "../core/errors.js";
import { byKey, decodeKeyCursor, pageOf, pageSize } from "../core/paging.js";
import { uuidField } from "../core/validate.js";
import { toTask } from "../tasks/convert.js";
import type { TaskEvents } from "../tasks/events.js";
import { fromCreateSchedule, scheduleRef, toSchedule } from "./convert.js";
import { compileCron, nextTick } from "./cron.js";
import type { ScheduleStore } from "./store.js";
import { createScheduledTask, type TickerDeps } from "./ticker.js";

/** What ScheduleService uses. */
export interface ScheduleServiceDeps extends Pick<TickerDeps, "config" | "metrics"> {
  schedules: ScheduleStore;
  artifacts: Pick<ArtifactStore, "get">;
  events: Pick<TaskEvents, "emit">;
}

/** ScheduleService: schedules that create tasks from a template on a cron expression. */
export function createScheduleService(
  app: ScheduleServiceDeps,
): ServiceImpl<typeof ScheduleService> {
  return {
    async createSchedule(req, ctx) {
      const schedule = fromCreateSchedule(
        req,
        callerOf(ctx.values).name,
        app.config.defaultShare,
        await app.schedules.now(),
      );
      if (schedule.inputArtifactId !== "") {
        const id = uuidField("template.input_artifact_id", schedule.inputArtifactId);
        const artifact = await app.artifacts.get(id);
        if (artifact.kind !== "INPUT" || artifact.taskId !== null) {
          throw invalid(
            "template.input_artifact_id must name an INPUT artifact uploaded without a task",
          );
        }
      }
      const { row } = await app.schedules.create(randomUUID(), schedule);
      return { schedule: toSchedule(row) };
    },

    async getSchedule(req) {
      return { schedule: toSchedule(await app.schedules.get(scheduleRef(req.scheduleId))) };
    },

    async listSchedules(req) {
      const size = pageSize(req.pageSize);
      const rows = await app.schedules.list(decodeKeyCursor(req.pageToken), size);
      const page = pageOf(rows, size, (r) => byKey(r.name));
      return { schedules: page.rows.map(toSchedule), nextPageToken: page.next };
    },

    async pauseSchedule(req) {
      return { schedule: toSchedule(await app.schedules.pause(scheduleRef(req.scheduleId))) };
    },

    async resumeSchedule(req) {
      const row = await app.schedules.resume(scheduleRef(req.scheduleId), (s, now) =>
        nextTick(compileCron(s.cron, s.timeZone), now),
      );
      return { schedule: toSchedule(row) };
    },

    async deleteSchedule(req) {
      await app.schedules.remove(scheduleRef(req.scheduleId));
      return {};
    },

    async triggerSchedule(req) {
      const task = await app.schedules.trigger(scheduleRef(req.scheduleId), (row, tasks, tx) =>
        createScheduledTask(app, { row, tasks, tx }, null),
      );
      app.events.emit([task.id]);
      return { task: toTask(task) };
    },
  };
}
