/**
 * The streams of the fault suite's revocation scenario (hostile.ts), in a
 * process of its own:
 *
 *   tsx revoke-client.ts STREAMS_URL ADMIN_URL WORKER_TOKEN CLIENT_TOKEN ADMIN_TOKEN WORKER_ID TASK_ID LEASE_JSON
 *
 * Opens a StreamLeases (renewing LEASE every 200 ms, with WORKER_TOKEN) and
 * a WatchTask of TASK_ID (with CLIENT_TOKEN) on STREAMS_URL, revokes both
 * tokens through ADMIN_URL a second later, and prints how each stream ended
 * and how long after the revocation, with the renewals answered after it.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { LeaseService, type StreamLeasesRequest } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { TokenService } from "../../gen/meshwork/v1/token_pb.js";

const [
  streamsUrl = "",
  adminUrl = "",
  workerToken = "",
  clientToken = "",
  adminToken = "",
  workerId = "",
  taskId = "",
  leaseJson = "{}",
] = process.argv.slice(2);
const lease = JSON.parse(leaseJson) as { taskId: string; attempt: number; leaseToken: string };
const as = (baseUrl: string, token: string) =>
  createGrpcTransport({
    baseUrl,
    interceptors: [
      (next) => (req) => {
        req.header.set("authorization", `Bearer ${token}`);
        return next(req);
      },
    ],
  });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let revokedAt = 0;
let renewalsAfter = 0;
const codeOf = (e: unknown) =>
  Code[ConnectError.from(e).code].replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();

async function* renewals(): AsyncGenerator<StreamLeasesRequest> {
  for (;;) {
    yield { workerId, leases: [lease] } as unknown as StreamLeasesRequest;
    await sleep(200);
  }
}
const stream = (async () => {
  try {
    for await (const _ of createClient(LeaseService, as(streamsUrl, workerToken)).streamLeases(
      renewals(),
    )) {
      if (revokedAt) renewalsAfter++;
    }
    return { code: "ended", ms: Date.now() - revokedAt };
  } catch (error) {
    return { code: codeOf(error), ms: Date.now() - revokedAt };
  }
})();
const watch = (async () => {
  try {
    for await (const _ of createClient(TaskService, as(streamsUrl, clientToken)).watchTask({
      taskId,
    }));
    return { code: "ended", ms: Date.now() - revokedAt };
  } catch (error) {
    return { code: codeOf(error), ms: Date.now() - revokedAt };
  }
})();
await sleep(1000);
const tokens = createClient(TokenService, as(adminUrl, adminToken));
revokedAt = Date.now();
await tokens.revokeToken({ name: "to-revoke-worker" });
await tokens.revokeToken({ name: "to-revoke-client" });
const timeout = sleep(15_000).then(() => ({ code: "still open", ms: 15_000 }));
const [s, w] = await Promise.all([Promise.race([stream, timeout]), Promise.race([watch, timeout])]);
console.log(JSON.stringify({ stream: { ...s, renewals: renewalsAfter }, watch: w }));
process.exit(0);
