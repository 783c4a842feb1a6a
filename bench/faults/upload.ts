/**
 * Uploads BYTES twice, for the fault suite's full-disk scenario (hostile.ts):
 * as an INPUT over UploadArtifact, and as a task's artifact over the PUT
 * byte route (a worker registered, a task created and claimed for it).
 *
 *   tsx upload.ts URL ADMIN_TOKEN BYTES
 *
 * Prints {"code","reason"} of the RPC (code "ok" when stored) and the PUT's
 * HTTP status.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  ArtifactService,
  type UploadArtifactRequest,
  UploadArtifactRequestSchema,
} from "../../gen/meshwork/v1/artifact_pb.js";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";

const [url = "", token = "", n = "0"] = process.argv.slice(2);
const data = Buffer.alloc(Number(n), 5);
const transport = createGrpcTransport({
  baseUrl: url,
  interceptors: [
    (next) => (req) => {
      req.header.set("authorization", `Bearer ${token}`);
      return next(req);
    },
  ],
});
async function* messages(): AsyncGenerator<UploadArtifactRequest> {
  yield create(UploadArtifactRequestSchema, {
    payload: { case: "header", value: { filename: "in.bin" } },
  });
  for (let at = 0; at < data.length; at += 256 * 1024) {
    yield create(UploadArtifactRequestSchema, {
      payload: { case: "chunk", value: data.subarray(at, at + 256 * 1024) },
    });
  }
}
let code = "ok";
let reason = "";
try {
  await createClient(ArtifactService, transport).uploadArtifact(messages());
} catch (error) {
  const e = ConnectError.from(error);
  code = Code[e.code].replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
  reason = e.findDetails(ErrorInfoSchema)[0]?.reason ?? "";
}
const workload = `upload-${Date.now()}`;
const { workerId } = await createClient(FleetService, transport).registerWorker({
  capabilities: [workload],
});
await createClient(TaskService, transport).createTask({ workload });
const { claims } = await createClient(LeaseService, transport).claimTasks({
  workerId,
  maxTasks: 1,
});
const claim = claims[0];
let status = 0;
if (claim) {
  const res = await fetch(`${url}/tasks/${claim.taskId}/artifacts/out.bin`, {
    method: "PUT",
    headers: {
      authorization: `Bearer ${token}`,
      "x-worker-id": workerId,
      "x-task-attempt": String(claim.attempt),
    },
    body: data,
  });
  status = res.status;
  await res.body?.cancel();
}
console.log(JSON.stringify({ code, reason, status }));
process.exit(0);
