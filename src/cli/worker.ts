import { toJson } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import {
  FleetService,
  type Worker,
  WorkerSchema,
  WorkerState,
} from "../../gen/meshwork/v1/fleet_pb.js";
import { parseDuration } from "../config.js";
import {
  endpointHelp,
  endpointOf,
  endpointOptions,
  type Io,
  parse,
  positionalsOf,
  runCommand,
  stdio,
  UsageError,
} from "./args.js";
import { transportFor } from "./connect.js";
import { workerIdOf } from "./resolve.js";
import { unknownSubcommand } from "./suggest.js";
import { ago, table } from "./table.js";

/** What a worker holds of what it offers, besides slots: "gpu 1/2 cpu 500/8000"; "-" for nothing. */
function useText(capacity: Record<string, bigint>, allocated: Record<string, bigint>): string {
  const parts = Object.entries(capacity)
    .filter(([k]) => k !== "slots")
    .map(([k, v]) => `${k} ${allocated[k] ?? 0n}/${v}`);
  return parts.join(" ") || "-";
}

const usage = `Usage:
  meshwork worker list [--capability C] [--state active|lost] [--drained | --not-drained]
  meshwork worker drain WORKER
  meshwork worker undrain WORKER
  meshwork worker deregister WORKER
  meshwork worker prune [--lost-for DURATION] [--dry-run]

WORKER is a worker id, the peer id it registered with, or its name when no
  other worker has it.
'drain' sets the worker's drained flag (DrainWorker): it gets no new claims or
  placements, and the leases it holds run on.
'undrain' clears the flag (DrainWorker with drained=false): it takes work again.
'deregister' removes the worker and releases its leases: those tasks go back
  to PENDING with their attempt kept; their ids are printed.
'prune' removes the workers LOST (no heartbeat) for --lost-for (30m, 12h,
  7d; default the coordinator's --worker-retention, else 24h) that hold no
  live lease (PruneWorkers, admin). The coordinator prunes by itself every
  minute with --worker-retention (default 24h). --dry-run counts them.

${endpointHelp}`;

const stateName = (s: WorkerState) => WorkerState[s] ?? String(s);

/** `meshwork worker …`; returns the exit code. */
export async function workerCommand(argv: string[], io: Io = stdio): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    (sub === undefined ? io.err : io.out).write(usage);
    return sub === undefined ? 2 : 0;
  }
  return runCommand(`meshwork worker ${sub}`, io, async () => {
    if (sub === "list") return list(rest, io);
    if (sub === "prune") return prune(rest, io);
    if (sub === "drain" || sub === "undrain" || sub === "deregister") return change(sub, rest, io);
    throw unknownSubcommand(
      sub,
      ["list", "drain", "undrain", "deregister", "prune"],
      "meshwork worker",
    );
  });
}

async function prune(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {
    ...endpointOptions,
    "lost-for": { type: "string" },
    "dry-run": { type: "boolean" },
  });
  if (values.help) return help(io);
  positionalsOf(positionals, []);
  let lostFor: ReturnType<typeof durationFromMs> | undefined;
  if (values["lost-for"] !== undefined) {
    const ms = parseDuration(values["lost-for"]);
    if (Number.isNaN(ms)) {
      throw new UsageError(
        `--lost-for must be a whole number with a unit, s, m, h or d (30m, 12h, 7d), not ${JSON.stringify(values["lost-for"])}`,
      );
    }
    lostFor = durationFromMs(ms);
  }
  const fleet = createClient(FleetService, transportFor(endpointOf(values)));
  const dryRun = values["dry-run"] === true;
  const { count } = await fleet.pruneWorkers({ lostFor, dryRun });
  if (values.json) io.out.write(`${JSON.stringify({ count, dryRun })}\n`);
  else if (dryRun) io.out.write(`${count} LOST workers would be removed (dry run)\n`);
  else io.out.write(`removed ${count} LOST workers\n`);
  return 0;
}

async function list(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {
    ...endpointOptions,
    capability: { type: "string" },
    state: { type: "string" },
    drained: { type: "boolean" },
    "not-drained": { type: "boolean" },
  });
  if (values.help) return help(io);
  positionalsOf(positionals, []);
  const state =
    values.state === undefined
      ? WorkerState.UNSPECIFIED
      : ({ active: WorkerState.ACTIVE, lost: WorkerState.LOST } as Record<string, WorkerState>)[
          values.state.toLowerCase()
        ];
  if (state === undefined) {
    throw new UsageError(`--state must be active or lost, not ${JSON.stringify(values.state)}`);
  }
  if (values.drained && values["not-drained"]) {
    throw new UsageError("give --drained or --not-drained, not both");
  }
  const drained = values.drained ? true : values["not-drained"] ? false : undefined;
  const fleet = createClient(FleetService, transportFor(endpointOf(values)));
  const rows: Worker[] = [];
  let pageToken = "";
  for (let page = 0; page < 100; page++) {
    const res = await fleet.listWorkers({
      pageSize: 1000,
      pageToken,
      capability: values.capability ?? "",
      state,
      drained,
    });
    rows.push(...res.workers);
    pageToken = res.nextPageToken;
    if (pageToken === "") break;
  }
  if (values.json) {
    io.out.write(`${JSON.stringify({ workers: rows.map((w) => toJson(WorkerSchema, w)) })}\n`);
    return 0;
  }
  io.out.write(
    table(
      ["ID", "NAME", "STATE", "DRAINED", "LEASES", "QUEUE", "HEARTBEAT", "USE", "CAPABILITIES"],
      rows.map((w) => [
        w.workerId,
        w.name || w.peerId || "-",
        stateName(w.state),
        w.drained ? "yes" : "no",
        `${w.activeLeases}/${w.maxConcurrency}`,
        String(w.queueDepth),
        ago(w.lastHeartbeatAt),
        useText(w.capacity, w.allocated),
        w.capabilities.join(",") || "-",
      ]),
    ),
  );
  return 0;
}

async function change(sub: "drain" | "undrain" | "deregister", args: string[], io: Io) {
  const { values, positionals } = parse(args, endpointOptions);
  if (values.help) return help(io);
  const [which = ""] = positionalsOf(positionals, ["WORKER"]);
  const transport = transportFor(endpointOf(values));
  const fleet = createClient(FleetService, transport);
  const workerId = await workerIdOf(transport, which);
  if (sub === "deregister") {
    const res = await fleet.deregisterWorker({ workerId });
    if (values.json) {
      io.out.write(`${JSON.stringify({ workerId, releasedTaskIds: res.releasedTaskIds })}\n`);
    } else {
      io.out.write(
        `deregistered worker ${workerId}; released ${res.releasedTaskIds.length} task(s)${res.releasedTaskIds.map((id) => `\n  ${id}`).join("")}\n`,
      );
    }
    return 0;
  }
  const res = await fleet.drainWorker({ workerId, drained: sub === "drain" });
  const w = res.worker;
  if (!w) throw new Error("the coordinator answered without the worker");
  if (values.json) io.out.write(`${JSON.stringify(toJson(WorkerSchema, w))}\n`);
  else {
    io.out.write(
      `worker ${w.workerId} (${w.name || w.peerId || "-"}) is ${w.drained ? "drained" : "not drained"}; ${w.activeLeases} lease(s) held\n`,
    );
  }
  return 0;
}

function help(io: Io): number {
  io.out.write(usage);
  return 0;
}
