import type { JsonObject } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { type Claim, LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { type Task, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { invalid } from "../core/errors.js";
import { sendJson } from "../http/json.js";
import type { PlainRoute, Response } from "../http/routes.js";
import { field, type JsonBody, readJson, secondsUtc } from "./body.js";
import type { InProcessCaller } from "./in-process.js";
import { restRoute } from "./route.js";

/**
 * The coordinator/worker REST contract (snake_case JSON), for workers
 * written against it: register, claim, heartbeat, result, failure. The byte
 * routes (input, artifact upload, download) are http/bytes.ts. Each route
 * is a thin adapter over one RPC, called in process (in-process.ts): the
 * RPC's auth rule, validation, lease check and idempotency apply as they
 * are; the adapter maps names, JSON shapes and statuses. Times are RFC 3339
 * UTC in whole seconds (`2026-07-23T12:05:00Z`); a lease expiry is rounded
 * down, never later than the lease really ends.
 */
export function workerRestRoutes(call: InProcessCaller, maxBodyBytes: number): PlainRoute[] {
  const lease = (body: JsonBody, taskId: string) => ({
    taskId,
    workerId: field.string(body, "worker_id") ?? "",
    attempt: field.int(body, "attempt") ?? 0,
    leaseToken: field.string(body, "lease_token") ?? "",
  });
  const leaseFields = ["worker_id", "attempt", "lease_token"];

  return [
    restRoute(
      ["POST"],
      /^\/workers\/register$/,
      ["FleetService/RegisterWorker"],
      "register a worker",
      async ({ res, body: bytes, caller }) => {
        const body = await readJson(bytes, maxBodyBytes, [
          "name",
          "capabilities",
          "cpu_count",
          "memory_mb",
          "labels",
          "api_base_url",
          "max_concurrency",
          "worker_id",
          "capacity",
        ]);
        const registered = await call(FleetService, caller).registerWorker({
          workerId: field.string(body, "worker_id") ?? "",
          name: field.string(body, "name") ?? "",
          capabilities: field.strings(body, "capabilities") ?? [],
          labels: field.stringMap(body, "labels") ?? {},
          cpuCount: field.int(body, "cpu_count") ?? 0,
          memoryMb: BigInt(field.int(body, "memory_mb") ?? 0),
          apiBaseUrl: field.string(body, "api_base_url") ?? "",
          maxConcurrency: field.int(body, "max_concurrency"),
          capacity: field.quantities(body, "capacity") ?? {},
        });
        sendJson(res, 200, {
          worker_id: registered.workerId,
          heartbeat_interval_seconds: registered.heartbeatIntervalSeconds,
        });
      },
    ),
    restRoute(
      ["POST"],
      /^\/tasks\/claim$/,
      ["LeaseService/ClaimTasks"],
      "claim tasks",
      async ({ res, body: bytes, caller }) => {
        const body = await readJson(bytes, maxBodyBytes, [
          "worker_id",
          "capabilities",
          "max_concurrency",
          "wait_seconds",
        ]);
        const { claims } = await call(LeaseService, caller).claimTasks({
          workerId: field.string(body, "worker_id") ?? "",
          capabilities: field.strings(body, "capabilities") ?? [],
          maxConcurrency: field.int(body, "max_concurrency"),
          waitSeconds: field.int(body, "wait_seconds") ?? 0,
          maxTasks: 1,
        });
        const [claim] = claims;
        if (!claim) {
          noContent(res);
          return;
        }
        sendJson(res, 200, claimJson(claim));
      },
    ),
    restRoute(
      ["POST"],
      /^\/tasks\/([^/]+)\/heartbeat$/,
      ["LeaseService/RenewLease"],
      "renew a lease",
      async ({ res, match, body: bytes, caller }) => {
        const body = await readJson(bytes, maxBodyBytes, [...leaseFields, "extend_seconds"]);
        const renewed = await call(LeaseService, caller).renewLease({
          ...lease(body, match[1] ?? ""),
          extendSeconds: field.int(body, "extend_seconds"),
        });
        sendJson(res, 200, {
          lease_expires_at: renewed.leaseExpiresAt
            ? secondsUtc(timestampDate(renewed.leaseExpiresAt))
            : null,
          cancel_requested: renewed.cancelRequested,
        });
      },
    ),
    restRoute(
      ["POST"],
      /^\/tasks\/([^/]+)\/result$/,
      ["LeaseService/CompleteTask"],
      "complete a task",
      async ({ res, match, body: bytes, caller }) => {
        const body = await readJson(bytes, maxBodyBytes, [
          ...leaseFields,
          "result",
          "result_summary",
          "metrics",
          "result_value",
        ]);
        const result = field.object(body, "result");
        if (result) {
          for (const key of Object.keys(result)) {
            if (!["artifact_id", "uri", "sha256", "content_type", "size_bytes"].includes(key)) {
              throw invalid(`unknown field result.${key.slice(0, 64)}`);
            }
          }
        }
        const { task } = await call(LeaseService, caller).completeTask({
          ...lease(body, match[1] ?? ""),
          result: result && {
            artifactId: field.string(result, "artifact_id") ?? "",
            uri: field.string(result, "uri") ?? "",
            sha256: field.string(result, "sha256") ?? "",
            contentType: field.string(result, "content_type") ?? "",
            sizeBytes: BigInt(field.int(result, "size_bytes") ?? 0),
          },
          resultSummary: field.string(body, "result_summary") ?? "",
          metrics: field.numberMap(body, "metrics") ?? {},
          // A JSON object; the RPC checks its size (≤ 64 KiB as JSON).
          resultValue: field.object(body, "result_value") as JsonObject | undefined,
        });
        sendJson(res, 200, taskOutcome(task));
      },
    ),
    restRoute(
      ["POST"],
      /^\/tasks\/([^/]+)\/failure$/,
      ["LeaseService/FailTask"],
      "fail a task",
      async ({ res, match, body: bytes, caller }) => {
        const body = await readJson(bytes, maxBodyBytes, [
          ...leaseFields,
          "error_code",
          "error_message",
          "retryable",
        ]);
        const { task } = await call(LeaseService, caller).failTask({
          ...lease(body, match[1] ?? ""),
          errorCode: field.string(body, "error_code") ?? "",
          errorMessage: field.string(body, "error_message") ?? "",
          retryable: field.bool(body, "retryable"),
        });
        sendJson(res, 200, {
          ...taskOutcome(task),
          retry_at: task?.notBefore ? secondsUtc(timestampDate(task.notBefore)) : null,
        });
      },
    ),
  ];
}

/** A claim as the worker contract shows it. */
function claimJson(c: Claim) {
  return {
    task_id: c.taskId,
    attempt: c.attempt,
    lease_expires_at: c.leaseExpiresAt ? secondsUtc(timestampDate(c.leaseExpiresAt)) : null,
    lease_token: c.leaseToken,
    workload: c.workload,
    input: c.input
      ? {
          artifact_id: c.input.artifactId,
          uri: c.input.uri,
          sha256: c.input.sha256,
          size_bytes: Number(c.input.sizeBytes),
          content_type: c.input.contentType,
        }
      : null,
    parameters: c.parameters ?? {},
    checkpoint_handle: c.checkpointHandle,
    correlation_id: c.correlationId,
    steps: c.steps ?? null,
    traceparent: c.traceparent,
    tracestate: c.tracestate,
    resources: Object.fromEntries(Object.entries(c.resources).map(([k, v]) => [k, Number(v)])),
    // `<ref or task id>/<filename>` → artifact id; GET /tasks/{task_id}/input/<name> serves each.
    dependency_outputs: c.dependencyOutputs,
    timeout_seconds: c.timeoutSeconds,
  };
}

/** What a completion or failure left the task in: `{"task_id", "attempt", "state"}`. */
function taskOutcome(task: Task | undefined) {
  return {
    task_id: task?.taskId ?? "",
    attempt: task?.attempt ?? 0,
    state: task ? TaskState[task.state].toLowerCase() : "",
  };
}

function noContent(res: Response): void {
  res.writeHead(204);
  res.end();
}
