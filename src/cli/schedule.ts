import { toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import {
  CatchUpPolicy,
  ListSchedulesResponseSchema,
  OverlapPolicy,
  type Schedule,
  ScheduleSchema,
  ScheduleService,
} from "../../gen/meshwork/v1/schedule_pb.js";
import { TaskSchema } from "../../gen/meshwork/v1/task_pb.js";
import {
  endpointHelp,
  endpointOf,
  endpointOptions,
  type Io,
  intFlag,
  parameterObject,
  parse,
  positionalsOf,
  runCommand,
  stdio,
  UsageError,
} from "./args.js";
import { transportFor } from "./connect.js";
import { preferenceFlag, quantities, requirementFlag } from "./scheduling-flags.js";
import { unknownSubcommand } from "./suggest.js";
import { enumName, record, table, when } from "./table.js";

const usage = `Usage:
  meshwork schedule create NAME --cron EXPR --workload W [--tz ZONE]
                           [--overlap skip|allow] [--catch-up skip|one|all] [--catch-up-limit N]
                           [--paused] [template flags]
  meshwork schedule get NAME|ID
  meshwork schedule list
  meshwork schedule pause NAME|ID
  meshwork schedule resume NAME|ID
  meshwork schedule delete NAME|ID
  meshwork schedule trigger NAME|ID

A schedule creates a task from its template at each tick of a cron
expression (ScheduleService, docs/workflows.md): 5 fields (minute hour
day-of-month month day-of-week), 6 with seconds first, or @hourly, @daily,
…, read in --tz (an IANA zone, default UTC). Each tick creates exactly one
task, however many coordinators run.

  --overlap skip|allow     a tick while the last task is live: creates nothing (skip, default) or its task
  --catch-up skip|one|all  ticks missed while no coordinator ran: dropped, one task for them all
                           (default), or one each, at most --catch-up-limit (default 10), the latest
  --paused                 create it paused ('resume' starts it, from now)

Template flags (as 'meshwork task create'):
  --workload W  --task-name N  --param K=V...  --params JSON  --input-artifact ID
  --capability C...  --priority N  --max-attempts N  --lease-seconds N
  --resources K=N...  --require EXPR...  --prefer W:EXPR...  --share PATH
  --concurrency-key K  --rate-key K

'list' shows each schedule's cron, zone, state, next and last run, last
task. 'trigger' creates a task now (paused or not) and prints its id.

${endpointHelp}`;

const subcommands = ["create", "get", "list", "pause", "resume", "delete", "trigger"];

const policyFlag = <T>(flag: string, value: string | undefined, names: Record<string, T>) => {
  if (value === undefined) return undefined;
  const v = names[value.toLowerCase()];
  if (v === undefined) {
    throw new UsageError(`--${flag} must be ${Object.keys(names).join(", ")}, not ${value}`);
  }
  return v;
};

const createOptions = {
  cron: { type: "string" },
  tz: { type: "string" },
  overlap: { type: "string" },
  "catch-up": { type: "string" },
  "catch-up-limit": { type: "string" },
  paused: { type: "boolean" },
  workload: { type: "string" },
  "task-name": { type: "string" },
  param: { type: "string", multiple: true },
  params: { type: "string" },
  "input-artifact": { type: "string" },
  capability: { type: "string", multiple: true },
  priority: { type: "string" },
  "max-attempts": { type: "string" },
  "lease-seconds": { type: "string" },
  resources: { type: "string", multiple: true },
  require: { type: "string", multiple: true },
  prefer: { type: "string", multiple: true },
  share: { type: "string" },
  "concurrency-key": { type: "string" },
  "rate-key": { type: "string" },
} as const;

const summary = (s: Schedule): [string, string][] => [
  ["schedule", s.scheduleId],
  ["name", s.name],
  ["cron", `${s.cron} (${s.timeZone})`],
  ["workload", s.template?.workload ?? ""],
  ["overlap", enumName(OverlapPolicy, s.overlapPolicy)],
  ["catch-up", `${enumName(CatchUpPolicy, s.catchUpPolicy)} (limit ${s.catchUpLimit})`],
  ["paused", s.paused ? "yes" : "no"],
  ["next run", when(s.nextRunAt)],
  ["last run", when(s.lastRunAt)],
  ["last task", s.lastTaskId || "-"],
];

/** `meshwork schedule …`; returns the exit code. */
export async function scheduleCommand(argv: string[], io: Io = stdio): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    (sub === undefined ? io.err : io.out).write(usage);
    return sub === undefined ? 2 : 0;
  }
  return runCommand(`meshwork schedule ${sub}`, io, async () => {
    if (!subcommands.includes(sub)) throw unknownSubcommand(sub, subcommands, "meshwork schedule");
    const { values, positionals } = parse(rest, {
      ...endpointOptions,
      ...(sub === "create" ? createOptions : {}),
    } as typeof endpointOptions & typeof createOptions);
    if (values.help) {
      io.out.write(usage);
      return 0;
    }
    const [ref = ""] = positionalsOf(positionals, sub === "list" ? [] : ["NAME"]);
    const schedules = createClient(ScheduleService, transportFor(endpointOf(values)));
    const show = (s: Schedule | undefined) => {
      if (!s) throw new Error("the coordinator returned no schedule");
      io.out.write(
        values.json ? `${JSON.stringify(toJson(ScheduleSchema, s))}\n` : record(summary(s)),
      );
      return 0;
    };
    switch (sub) {
      case "create": {
        if (!values.cron) throw new UsageError("--cron is required");
        if (!values.workload) throw new UsageError("--workload is required");
        const res = await schedules.createSchedule({
          name: ref,
          cron: values.cron,
          timeZone: values.tz ?? "",
          overlapPolicy: policyFlag("overlap", values.overlap, {
            skip: OverlapPolicy.SKIP,
            allow: OverlapPolicy.ALLOW,
          }),
          catchUpPolicy: policyFlag("catch-up", values["catch-up"], {
            skip: CatchUpPolicy.SKIP,
            one: CatchUpPolicy.ONE,
            all: CatchUpPolicy.ALL,
          }),
          catchUpLimit: intFlag("catch-up-limit", values["catch-up-limit"], 1, 1000),
          paused: values.paused ?? false,
          template: {
            workload: values.workload,
            name: values["task-name"] ?? "",
            parameters: parameterObject(values.params, values.param ?? []),
            input: values["input-artifact"]
              ? { case: "inputArtifactId", value: values["input-artifact"] }
              : { case: undefined },
            requiredCapabilities: values.capability ?? [],
            priority: intFlag("priority", values.priority, -2147483648, 2147483647) ?? 0,
            maxAttempts: intFlag("max-attempts", values["max-attempts"], 1, 100),
            leaseSeconds: intFlag("lease-seconds", values["lease-seconds"], 5, 86400),
            resources: quantities("resources", values.resources ?? []),
            requirements: (values.require ?? []).map(requirementFlag),
            preferences: (values.prefer ?? []).map(preferenceFlag),
            share: values.share ?? "",
            concurrencyKey: values["concurrency-key"] ?? "",
            rateKey: values["rate-key"] ?? "",
          },
        });
        return show(res.schedule);
      }
      case "get":
        return show((await schedules.getSchedule({ scheduleId: ref })).schedule);
      case "pause":
        return show((await schedules.pauseSchedule({ scheduleId: ref })).schedule);
      case "resume":
        return show((await schedules.resumeSchedule({ scheduleId: ref })).schedule);
      case "delete":
        await schedules.deleteSchedule({ scheduleId: ref });
        io.out.write(values.json ? "{}\n" : `deleted schedule ${ref} (its tasks stay)\n`);
        return 0;
      case "trigger": {
        const { task } = await schedules.triggerSchedule({ scheduleId: ref });
        if (!task) throw new Error("the coordinator returned no task");
        if (values.json) io.out.write(`${JSON.stringify(toJson(TaskSchema, task))}\n`);
        else {
          io.out.write(`${task.taskId}\n`);
          io.err.write(`created task ${task.taskId} (${task.workload}) from schedule ${ref}\n`);
        }
        return 0;
      }
      default: {
        const all = await schedules.listSchedules({ pageSize: 1000 });
        for (let next = all.nextPageToken; next; ) {
          const page = await schedules.listSchedules({ pageSize: 1000, pageToken: next });
          all.schedules.push(...page.schedules);
          next = page.nextPageToken;
        }
        all.nextPageToken = "";
        if (values.json) {
          io.out.write(`${JSON.stringify(toJson(ListSchedulesResponseSchema, all))}\n`);
          return 0;
        }
        io.out.write(
          all.schedules.length === 0
            ? "SCHEDULES  none\n"
            : table(
                ["NAME", "CRON", "TZ", "PAUSED", "NEXT RUN", "LAST RUN", "LAST TASK"],
                all.schedules.map((s) => [
                  s.name,
                  s.cron,
                  s.timeZone,
                  s.paused ? "yes" : "no",
                  when(s.nextRunAt),
                  when(s.lastRunAt),
                  s.lastTaskId || "-",
                ]),
              ),
        );
        return 0;
      }
    }
  });
}
