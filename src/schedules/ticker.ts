import { toArtifactRefJson } from "../artifacts/convert.js";
import { createArtifactStore } from "../artifacts/store.js";
import type { Config } from "../config.js";
import { DomainError } from "../core/errors.js";
import { newTaskId } from "../core/ids.js";
import type { Db } from "../db/database.js";
import type { TaskRow } from "../db/schema/index.js";
import type { Logger } from "../log.js";
import type { Metrics } from "../metrics/metrics.js";
import type { TaskStore } from "../tasks/store.js";
import { taskOfTick } from "./convert.js";
import { compileCron, planTicks } from "./cron.js";
import type { DueSchedule, ScheduleRow, ScheduleStore, TickOutcome } from "./store.js";

export interface TickerDeps {
  schedules: Pick<ScheduleStore, "tickDue">;
  config: Pick<Config, "defaultShare" | "publicUrl" | "dispatchDefault" | "dispatchWorkloads">;
  log: Logger;
  metrics: Pick<Metrics, "tasksCreated">;
}

/** Schedules one pass runs at most (the rest wait for the next second). */
const schedulesPerPass = 100;

/**
 * Creates the task of one tick (`tick`: its idempotency key) or of a
 * trigger (null: no key), from the schedule's template, in the transaction
 * of `tasks` and `tx`. The template's input artifact is read again here:
 * its reference carries the artifact's current checksum and size.
 */
export async function createScheduledTask(
  deps: Pick<TickerDeps, "config" | "metrics">,
  at: { row: ScheduleRow; tasks: TaskStore; tx: Db },
  tick: Date | null,
): Promise<TaskRow> {
  const { req, task } = taskOfTick(at.row, tick, deps.config.defaultShare);
  if (req.dispatch === undefined) {
    task.dispatch =
      deps.config.dispatchDefault || deps.config.dispatchWorkloads.includes(task.workload);
  }
  if (req.input.case === "inputArtifactId") {
    const artifact = await createArtifactStore(at.tx).get(req.input.value);
    task.input = toArtifactRefJson(artifact, deps.config.publicUrl);
  }
  task.id = newTaskId();
  const [row] = await at.tasks.create([task]);
  if (!row) throw new Error("create returned no task");
  if (row.id === task.id) deps.metrics.tasksCreated.inc({ workload: row.workload });
  return row;
}

/**
 * Runs a due schedule's ticks (cron.ts planTicks: the on-time ones, after
 * the missed ones its catch-up policy keeps), oldest first. With the SKIP
 * overlap policy a tick while a task of the schedule is live creates
 * nothing: so a catch-up creates one task at most. A tick whose task is
 * refused (its input artifact was removed, say) is logged and counts as
 * run: the schedule goes on.
 */
async function runTicks(deps: TickerDeps, due: DueSchedule): Promise<TickOutcome> {
  const { row, now } = due;
  let plan: ReturnType<typeof planTicks>;
  try {
    const cron = compileCron(row.cron, row.timeZone);
    plan = planTicks(cron, row.nextRunAt ?? now, now, row.catchUpPolicy, row.catchUpLimit);
  } catch (error) {
    if (!(error instanceof DomainError)) throw error;
    deps.log.error(
      { scheduleId: row.id, reason: error.reason, why: error.message },
      "a schedule's cron expression no longer parses: it stops ticking",
    );
    return { nextRunAt: null, lastRunAt: row.lastRunAt };
  }
  let live = row.overlapPolicy === "SKIP" && plan.ticks.length > 0 && (await due.hasLiveTask());
  let lastTaskId: string | undefined;
  for (const tick of plan.ticks) {
    if (live) {
      deps.log.debug({ scheduleId: row.id, tick }, "schedule tick skipped: its last task is live");
      continue;
    }
    try {
      const task = await createScheduledTask(deps, due, tick);
      lastTaskId = task.id;
      live = row.overlapPolicy === "SKIP";
      deps.log.debug({ scheduleId: row.id, tick, taskId: task.id }, "schedule tick ran");
    } catch (error) {
      if (!(error instanceof DomainError)) throw error;
      deps.log.warn(
        { scheduleId: row.id, tick, reason: error.reason, why: error.message },
        "a schedule's tick created no task",
      );
    }
  }
  return { nextRunAt: plan.next, lastRunAt: plan.ticks.at(-1) ?? row.lastRunAt, lastTaskId };
}

/**
 * The once-a-second pass every replica runs over the due schedules. Each
 * schedule's ticks run in the transaction that locks its row (store.ts
 * `tickDue`), so replicas share the due schedules without running a tick
 * twice; the tick's idempotency key makes a repeat find the task made
 * before.
 */
export function createScheduleTicker(deps: TickerDeps, intervalMs: number) {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<number> | undefined;

  async function pass(): Promise<number> {
    let n = 0;
    while (n < schedulesPerPass) {
      const outcome = await deps.schedules.tickDue((due) => runTicks(deps, due));
      if (!outcome) break;
      n++;
    }
    return n;
  }

  return {
    /** Runs one pass now and returns how many schedules it ran (tests call this instead of waiting). */
    async runOnce(): Promise<number> {
      while (running) await running.catch(() => {});
      running = pass().finally(() => {
        running = undefined;
      });
      return running;
    },
    start(): void {
      timer = setInterval(() => {
        if (running) return;
        this.runOnce().catch((error: unknown) =>
          deps.log.error({ err: error }, "schedule tick failed"),
        );
      }, intervalMs);
      timer.unref();
    },
    async stop(): Promise<void> {
      clearInterval(timer);
      while (running) await running.catch(() => {});
    },
  };
}

export type ScheduleTicker = ReturnType<typeof createScheduleTicker>;
