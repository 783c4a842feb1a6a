import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CatchUpPolicy,
  type CreateScheduleRequestSchema,
  OverlapPolicy,
  ScheduleService,
} from "../../gen/meshwork/v1/schedule_pb.js";
import { rowsOf } from "../../src/db/values.js";
import { outcome } from "../support/errors.js";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

// ScheduleService through the real handlers, and the ticker run by hand
// (runOnce): time is moved by setting next_run_at in the past, never by
// waiting. "@yearly" ticks on 1 January only, so that the ticks a test
// expects are the ones it set.

let h: Harness;
let schedules: ReturnType<typeof createClient<typeof ScheduleService>>;
beforeAll(async () => {
  h = await createHarness();
  schedules = createClient(ScheduleService, h.transport);
});
afterAll(() => h.close());

type Over = Omit<Partial<MessageInitShape<typeof CreateScheduleRequestSchema>>, "$typeName">;

let n = 0;
const uniqueName = () => `s-${uniqueWorkload("")}-${++n}`;

const request = (over: Over = {}) => ({
  name: uniqueName(),
  cron: "@yearly",
  template: { workload: uniqueWorkload(), parameters: { report: "daily" } },
  ...over,
});

/** Moves a schedule's next run to `at` (an SQL expression): the ticks from there are due. */
async function dueSince(id: string, at: string): Promise<void> {
  await h.app.database.db.execute(
    sql`update schedules set next_run_at = ${sql.raw(at)} where id = ${id}`,
  );
}

/** The tasks of a schedule, oldest tick first: their idempotency keys and states. */
const tasksOf = (id: string) =>
  rowsOf<{ id: string; idempotency_key: string | null; state: string; workload: string }>(
    h.app.database.db,
    sql`select id, idempotency_key, state, workload from tasks where schedule_id = ${id}
        order by idempotency_key nulls last, created_at`,
  );

const jan1 = (year: number) => new Date(Date.UTC(year, 0, 1));
const thisYear = new Date().getUTCFullYear();
const key = (id: string, d: Date) => `schedule:${id}:${d.toISOString()}`;

describe("CreateSchedule", () => {
  it("refuses bad input with invalid_argument and creates nothing", async () => {
    const bad: [string, Over][] = [
      ["no name", { name: "" }],
      ["a bad name", { name: "a b" }],
      ["no cron", { cron: "" }],
      ["4 fields", { cron: "* * * *" }],
      ["7 fields", { cron: "0 0 0 1 1 * 2030" }],
      ["a bad field", { cron: "61 * * * *" }],
      ["a date", { cron: "2030-01-01T00:00:00" }],
      ["@reboot", { cron: "@reboot" }],
      ["never fires", { cron: "0 0 30 2 *" }],
      ["a bad time zone", { timeZone: "Mars/Olympus" }],
      ["no template", { template: undefined }],
      ["no workload", { template: { workload: "" } }],
      ["depends_on", { template: { workload: "w", dependsOn: [crypto.randomUUID()] } }],
      ["ref", { template: { workload: "w", ref: "a" } }],
      ["idempotency_key", { template: { workload: "w", idempotencyKey: "k" } }],
      [
        "deadline",
        { template: { workload: "w", deadline: { seconds: 4_000_000_000n, nanos: 0 } } },
      ],
      [
        "input_data",
        { template: { workload: "w", input: { case: "inputData", value: new Uint8Array(3) } } },
      ],
      ["catch_up_limit 0", { catchUpLimit: 0 }],
      ["catch_up_limit 1001", { catchUpLimit: 1001 }],
      ["an unknown overlap policy", { overlapPolicy: 9 as OverlapPolicy }],
      ["an unknown catch-up policy", { catchUpPolicy: 9 as CatchUpPolicy }],
    ];
    for (const [what, over] of bad) {
      const req = request(over);
      const got = await outcome(schedules.createSchedule(req));
      expect({ what, code: got.code }).toEqual({ what, code: "InvalidArgument" });
      expect(got.message).not.toBe("");
      if (req.name !== "" && req.name !== "a b") {
        expect((await outcome(schedules.getSchedule({ scheduleId: req.name }))).code).toBe(
          "NotFound",
        );
      }
    }
  });

  it("defaults the policies, sets the next run, and is idempotent by name", async () => {
    const req = request({ timeZone: "Europe/Paris", cron: "0 9 * * 1-5" });
    const { schedule } = await schedules.createSchedule(req);
    expect(schedule).toMatchObject({
      name: req.name,
      cron: "0 9 * * 1-5",
      timeZone: "Europe/Paris",
      overlapPolicy: OverlapPolicy.SKIP,
      catchUpPolicy: CatchUpPolicy.ONE,
      catchUpLimit: 10,
      paused: false,
      lastTaskId: "",
    });
    expect(schedule?.template?.workload).toBe(req.template.workload);
    const next = schedule?.nextRunAt ? timestampDate(schedule.nextRunAt) : new Date(0);
    expect(next.getTime()).toBeGreaterThan(Date.now() - 60_000);
    // 09:00 in Paris is 07:00 or 08:00 UTC, on a weekday.
    expect([7, 8]).toContain(next.getUTCHours());
    expect([1, 2, 3, 4, 5]).toContain(next.getUTCDay());

    const again = await schedules.createSchedule(req);
    expect(again.schedule?.scheduleId).toBe(schedule?.scheduleId);
    const other = await outcome(schedules.createSchedule({ ...req, cron: "0 10 * * *" }));
    expect(other).toMatchObject({ code: "AlreadyExists", reason: "IDEMPOTENCY_KEY_REUSED" });
    const { schedule: kept } = await schedules.getSchedule({ scheduleId: req.name });
    expect(kept?.cron).toBe("0 9 * * 1-5");
  });

  it("takes 6 fields (seconds first) and nicknames; a paused schedule has no next run", async () => {
    const six = await schedules.createSchedule(request({ cron: "*/10 * * * * *" }));
    expect(six.schedule?.nextRunAt).toBeDefined();
    const paused = await schedules.createSchedule(request({ cron: "@hourly", paused: true }));
    expect(paused.schedule?.paused).toBe(true);
    expect(paused.schedule?.nextRunAt).toBeUndefined();
    await schedules.deleteSchedule({ scheduleId: six.schedule?.scheduleId ?? "" });
  });
});

describe("Get, List, Pause, Resume, Delete, Trigger", () => {
  it("gets by id or name, and lists by name, page by page", async () => {
    const prefix = uniqueName();
    const made = [];
    for (const suffix of ["c", "a", "b"]) {
      made.push(
        (await schedules.createSchedule(request({ name: `${prefix}-${suffix}` }))).schedule,
      );
    }
    const byId = await schedules.getSchedule({ scheduleId: made[0]?.scheduleId ?? "" });
    expect(byId.schedule?.name).toBe(`${prefix}-c`);
    expect((await outcome(schedules.getSchedule({ scheduleId: "" }))).code).toBe("InvalidArgument");
    expect((await outcome(schedules.getSchedule({ scheduleId: "no-such" }))).code).toBe("NotFound");

    const names: string[] = [];
    let pageToken = "";
    do {
      const page = await schedules.listSchedules({ pageSize: 2, pageToken });
      expect(page.schedules.length).toBeLessThanOrEqual(2);
      names.push(...page.schedules.map((s) => s.name));
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    expect(names).toEqual([...names].sort());
    expect(names.filter((x) => x.startsWith(prefix))).toEqual(
      ["a", "b", "c"].map((s) => `${prefix}-${s}`),
    );
    expect((await outcome(schedules.listSchedules({ pageToken: "junk" }))).reason).toBe(
      "INVALID_PAGE_TOKEN",
    );
    expect((await outcome(schedules.listSchedules({ pageSize: 1001 }))).code).toBe(
      "InvalidArgument",
    );
  });

  it("pauses (no next run, no ticks) and resumes from now", async () => {
    const { schedule } = await schedules.createSchedule(request());
    const id = schedule?.scheduleId ?? "";
    const paused = await schedules.pauseSchedule({ scheduleId: id });
    expect(paused.schedule?.paused).toBe(true);
    expect(paused.schedule?.nextRunAt).toBeUndefined();
    expect((await schedules.pauseSchedule({ scheduleId: id })).schedule?.paused).toBe(true);
    // A paused schedule does not tick, even with a next run in the past.
    await dueSince(id, "now() - interval '3 years'");
    await h.app.scheduleTicker.runOnce();
    expect(await tasksOf(id)).toEqual([]);

    const resumed = await schedules.resumeSchedule({ scheduleId: schedule?.name ?? "" });
    expect(resumed.schedule?.paused).toBe(false);
    // From now: the next 1 January, not the ticks missed while paused.
    expect(
      resumed.schedule?.nextRunAt ? timestampDate(resumed.schedule.nextRunAt) : undefined,
    ).toEqual(jan1(thisYear + 1));
    await h.app.scheduleTicker.runOnce();
    expect(await tasksOf(id)).toEqual([]);
    // Resuming a running schedule changes nothing.
    const twice = await schedules.resumeSchedule({ scheduleId: id });
    expect(twice.schedule?.nextRunAt).toEqual(resumed.schedule?.nextRunAt);
  });

  it("triggers a task now (paused or not), and a delete leaves the tasks", async () => {
    const req = request({ paused: true });
    const { schedule } = await schedules.createSchedule(req);
    const id = schedule?.scheduleId ?? "";
    const { task } = await schedules.triggerSchedule({ scheduleId: req.name });
    expect(task).toMatchObject({
      workload: req.template.workload,
      parameters: { report: "daily" },
      scheduleId: id,
      idempotencyKey: "",
      share: "default",
    });
    const second = await schedules.triggerSchedule({ scheduleId: id });
    expect(second.task?.taskId).not.toBe(task?.taskId);
    const after = await schedules.getSchedule({ scheduleId: id });
    expect(after.schedule?.lastTaskId).toBe(second.task?.taskId);
    expect(after.schedule?.lastRunAt).toBeUndefined();

    await schedules.deleteSchedule({ scheduleId: id });
    expect((await outcome(schedules.getSchedule({ scheduleId: id }))).code).toBe("NotFound");
    expect((await outcome(schedules.deleteSchedule({ scheduleId: id }))).code).toBe("NotFound");
    expect((await outcome(schedules.triggerSchedule({ scheduleId: id }))).code).toBe("NotFound");
    expect((await h.tasks.getTask({ taskId: task?.taskId ?? "" })).task?.taskId).toBe(task?.taskId);
    expect((await tasksOf(id)).length).toBe(2);
  });
});

describe("ticks", () => {
  it("a due tick creates one task from the template, with the tick's key, once", async () => {
    const { schedule } = await schedules.createSchedule(request());
    const id = schedule?.scheduleId ?? "";
    await dueSince(id, "date_trunc('second', now()) - interval '1 second'");
    const [{ due } = { due: "" }] = await rowsOf<{ due: string }>(
      h.app.database.db,
      sql`select to_char(next_run_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as due
          from schedules where id = ${id}`,
    );
    await h.app.scheduleTicker.runOnce();
    await h.app.scheduleTicker.runOnce();
    const made = await tasksOf(id);
    expect(made.map((t) => t.idempotency_key)).toEqual([`schedule:${id}:${due}`]);
    const { task } = await h.tasks.getTask({ taskId: made[0]?.id ?? "" });
    expect(task).toMatchObject({ workload: schedule?.template?.workload, scheduleId: id });
    expect(task?.parameters).toEqual({ report: "daily" });
    const after = (await schedules.getSchedule({ scheduleId: id })).schedule;
    expect(after?.lastTaskId).toBe(made[0]?.id);
    expect(after?.lastRunAt && timestampDate(after.lastRunAt).toISOString()).toBe(due);
    expect(after?.nextRunAt && timestampDate(after.nextRunAt)).toEqual(jan1(thisYear + 1));
  });

  it("overlap SKIP: a tick while the last task is live creates nothing but counts as run", async () => {
    const { schedule } = await schedules.createSchedule(
      request({ overlapPolicy: OverlapPolicy.SKIP }),
    );
    const id = schedule?.scheduleId ?? "";
    await dueSince(id, "now() - interval '1 second'");
    await h.app.scheduleTicker.runOnce();
    expect((await tasksOf(id)).length).toBe(1);
    await dueSince(id, "now() - interval '2 seconds'");
    await h.app.scheduleTicker.runOnce();
    expect((await tasksOf(id)).length).toBe(1);
    const first = (await schedules.getSchedule({ scheduleId: id })).schedule;
    // Counted as run: the last run moved to the skipped tick, the last task stayed.
    expect(first?.lastRunAt).toBeDefined();
    expect(first?.nextRunAt && timestampDate(first.nextRunAt)).toEqual(jan1(thisYear + 1));
    const [only] = await tasksOf(id);
    expect(first?.lastTaskId).toBe(only?.id);
    // Once the task has finished, the next tick creates one again.
    await h.tasks.cancelTask({ taskId: only?.id ?? "" });
    await dueSince(id, "now() - interval '3 seconds'");
    await h.app.scheduleTicker.runOnce();
    expect((await tasksOf(id)).length).toBe(2);
  });

  it("overlap ALLOW: a tick creates its task while the last one is live", async () => {
    const { schedule } = await schedules.createSchedule(
      request({ overlapPolicy: OverlapPolicy.ALLOW }),
    );
    const id = schedule?.scheduleId ?? "";
    await dueSince(id, "now() - interval '1 second'");
    await h.app.scheduleTicker.runOnce();
    await dueSince(id, "now() - interval '2 seconds'");
    await h.app.scheduleTicker.runOnce();
    const made = await tasksOf(id);
    expect(made.map((t) => t.state)).toEqual(["PENDING", "PENDING"]);
  });

  const catchUp = async (over: Over) => {
    const { schedule } = await schedules.createSchedule(
      request({ overlapPolicy: OverlapPolicy.ALLOW, ...over }),
    );
    const id = schedule?.scheduleId ?? "";
    // Down since 1 January 2019: that tick and each 1 January since were missed.
    await dueSince(id, "'2019-01-01T00:00:00Z'");
    await h.app.scheduleTicker.runOnce();
    const after = (await schedules.getSchedule({ scheduleId: id })).schedule;
    expect(after?.nextRunAt && timestampDate(after.nextRunAt)).toEqual(jan1(thisYear + 1));
    return { id, keys: (await tasksOf(id)).map((t) => t.idempotency_key), after };
  };

  it("catch-up SKIP drops the missed ticks: the next is the one after now", async () => {
    const { keys, after } = await catchUp({ catchUpPolicy: CatchUpPolicy.SKIP });
    expect(keys).toEqual([]);
    expect(after?.lastRunAt).toBeUndefined();
  });

  it("catch-up ONE runs one task for all the missed ticks (the latest)", async () => {
    const { id, keys, after } = await catchUp({ catchUpPolicy: CatchUpPolicy.ONE });
    expect(keys).toEqual([key(id, jan1(thisYear))]);
    expect(after?.lastRunAt && timestampDate(after.lastRunAt)).toEqual(jan1(thisYear));
  });

  it("catch-up ALL runs a task per missed tick, the most recent catch_up_limit, oldest first", async () => {
    const { id, keys } = await catchUp({ catchUpPolicy: CatchUpPolicy.ALL, catchUpLimit: 3 });
    expect(keys).toEqual([thisYear - 2, thisYear - 1, thisYear].map((y) => key(id, jan1(y))));
    const all = await catchUp({ catchUpPolicy: CatchUpPolicy.ALL, catchUpLimit: 1000 });
    expect(all.keys.length).toBe(thisYear - 2019 + 1);
    expect(all.keys[0]).toBe(key(all.id, jan1(2019)));
  });

  it("catch-up ALL with overlap SKIP creates one task: the others would overlap it", async () => {
    const { id, keys, after } = await catchUp({
      catchUpPolicy: CatchUpPolicy.ALL,
      catchUpLimit: 3,
      overlapPolicy: OverlapPolicy.SKIP,
    });
    expect(keys).toEqual([key(id, jan1(thisYear - 2))]);
    expect(after?.lastRunAt && timestampDate(after.lastRunAt)).toEqual(jan1(thisYear));
  });

  it("a tick whose task is refused is logged and counts as run; the schedule goes on", async () => {
    const { schedule } = await schedules.createSchedule(request());
    const id = schedule?.scheduleId ?? "";
    // A template the task create refuses at the tick (as if its input artifact had been removed).
    await h.app.database.db.execute(
      sql`update schedules set template = jsonb_build_object('workload', ${uniqueWorkload()}::text,
            'inputArtifactId', ${crypto.randomUUID()}::text) where id = ${id}`,
    );
    await dueSince(id, "now() - interval '1 second'");
    await h.app.scheduleTicker.runOnce();
    expect(await tasksOf(id)).toEqual([]);
    const after = (await schedules.getSchedule({ scheduleId: id })).schedule;
    expect(after?.lastRunAt).toBeDefined();
    expect(after?.nextRunAt && timestampDate(after.nextRunAt)).toEqual(jan1(thisYear + 1));
  });
});
