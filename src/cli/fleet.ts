import { toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import {
  FleetService,
  GetFleetStatusResponseSchema,
  WorkerState,
} from "../../gen/meshwork/v1/fleet_pb.js";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import {
  endpointHelp,
  endpointOf,
  endpointOptions,
  type Io,
  parse,
  positionalsOf,
  runCommand,
  stdio,
} from "./args.js";
import { transportFor } from "./connect.js";
import { unknownSubcommand } from "./suggest.js";
import { ago, table } from "./table.js";

const usage = `Usage:
  meshwork fleet status

'status' (GetFleetStatus) prints tasks by state, the PENDING backlog by
workload with the age of its oldest task, and each worker's load.

${endpointHelp}`;

/** `meshwork fleet …`; returns the exit code. */
export async function fleetCommand(argv: string[], io: Io = stdio): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    (sub === undefined ? io.err : io.out).write(usage);
    return sub === undefined ? 2 : 0;
  }
  return runCommand(`meshwork fleet ${sub}`, io, async () => {
    if (sub !== "status") throw unknownSubcommand(sub, ["status"], "meshwork fleet");
    const { values, positionals } = parse(rest, endpointOptions);
    if (values.help) {
      io.out.write(usage);
      return 0;
    }
    positionalsOf(positionals, []);
    const fleet = createClient(FleetService, transportFor(endpointOf(values)));
    const res = await fleet.getFleetStatus({});
    if (values.json) {
      io.out.write(`${JSON.stringify(toJson(GetFleetStatusResponseSchema, res))}\n`);
      return 0;
    }
    io.out.write(
      `TASKS  ${res.taskCounts.map((c) => `${TaskState[c.state] ?? c.state} ${c.count}`).join("  ")}\n\n`,
    );
    io.out.write(
      res.backlog.length === 0
        ? "BACKLOG  none\n\n"
        : `${table(
            ["WORKLOAD", "PENDING", "OLDEST"],
            res.backlog.map((b) => [b.workload, String(b.pendingCount), ago(b.oldestCreatedAt)]),
          )}\n`,
    );
    io.out.write(
      res.workers.length === 0
        ? "WORKERS  none\n"
        : table(
            ["WORKER", "NAME", "STATE", "DRAINED", "LEASES", "FREE", "QUEUE"],
            res.workers.map((w) => [
              w.workerId,
              w.name || w.peerId || "-",
              WorkerState[w.state] ?? String(w.state),
              w.drained ? "yes" : "no",
              `${w.activeLeases}/${w.maxConcurrency}`,
              String(w.freeSlots),
              String(w.queueDepth),
            ]),
          ),
    );
    return 0;
  });
}
