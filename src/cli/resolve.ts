import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { isUuid } from "../core/validate.js";
import { UsageError } from "./args.js";

/**
 * The worker id that `which` names: a worker id as it is; else the worker
 * registered with that peer id; else the one worker of that name (what
 * people know a machine by). A name several workers share is a usage
 * error listing them; a name no worker has is not_found.
 */
export async function workerIdOf(transport: Transport, which: string): Promise<string> {
  if (isUuid(which)) return which;
  const fleet = createClient(FleetService, transport);
  try {
    const { worker } = await fleet.getWorker({ peerId: which });
    if (worker) return worker.workerId;
  } catch (error) {
    if (!(error instanceof ConnectError && error.code === Code.NotFound)) throw error;
  }
  const named: string[] = [];
  let pageToken = "";
  do {
    const res = await fleet.listWorkers({ pageSize: 1000, pageToken });
    for (const w of res.workers) if (w.name === which) named.push(w.workerId);
    pageToken = res.nextPageToken;
  } while (pageToken !== "" && named.length < 10);
  if (named.length === 1 && named[0]) return named[0];
  if (named.length > 1) {
    throw new UsageError(
      `${named.length} workers are named ${JSON.stringify(which)}: give an id (${named.slice(0, 5).join(", ")})`,
    );
  }
  throw new ConnectError(
    `no worker has the id, peer id or name ${JSON.stringify(which.slice(0, 128))}`,
    Code.NotFound,
  );
}
