import type { JsonObject } from "@bufbuild/protobuf";
import { type Task, TaskState } from "../../../gen/meshwork/v1/task_pb.js";
import { DomainError, invalid } from "../../core/errors.js";
import { isUuid } from "../../core/validate.js";
import type { PlainRoute } from "../../http/routes.js";
import { field } from "../body.js";
import { type DirectorRoute, iso, required0, type Session } from "./session.js";

/** The director's `status` names (any case) as task states a worker may report. */
const reportable: Record<string, TaskState> = {
  running: TaskState.RUNNING,
  succeeded: TaskState.SUCCEEDED,
  failed: TaskState.FAILED,
  pending: TaskState.PENDING,
};

/**
 * The lease fields of a lease-bound call on `taskId`, named by the body's
 * leaseToken alone: the RPC looks up the lease the token names and judges
 * the call by every lease rule (LeaseService). The director contract
 * requires the token: without one, no lease is named.
 */
function leaseRef(taskId: string, leaseToken: string | undefined) {
  if (!isUuid(taskId)) throw invalid("taskId must be a UUID");
  if (!leaseToken) {
    throw new DomainError(
      "aborted",
      "TOKEN_MISMATCH",
      "leaseToken is required: it names the task's lease",
      { taskId },
    );
  }
  return { taskId, workerId: "", attempt: 0, leaseToken };
}

/**
 * The lease routes, a lease named by its token: extend, release with a
 * checkpoint, and status reports (running, succeeded, failed, pending).
 */
export function leaseRoutes(route: DirectorRoute): PlainRoute[] {
  return [
    route(
      ["POST"],
      "/tasks/{id}/lease/extend",
      ["LeaseService/RenewLease"],
      "extend a lease",
      async (s, _req, m) => {
        const body = await s.json(["leaseToken", "extendSeconds"]);
        const lease = leaseRef(m[1] ?? "", field.string(body, "leaseToken"));
        const renewed = await s.leases.renewLease({
          ...lease,
          extendSeconds: field.int(body, "extendSeconds"),
        });
        return [
          200,
          {
            // The holder proved the lease: the renewal answers its task
            // (even to a worker token, which may not call GetTask).
            ...(await s.taskJson(required0(renewed.task))),
            leaseToken: lease.leaseToken,
            leaseExpiresUtc: iso(renewed.leaseExpiresAt),
          },
        ];
      },
    ),

    route(
      ["POST"],
      "/tasks/{id}/migrate-for-checkpoint",
      ["LeaseService/ReleaseTask"],
      "release a task with a checkpoint",
      async (s, _req, m) => {
        const body = await s.json(["leaseToken", "checkpointHandle"]);
        const lease = leaseRef(m[1] ?? "", field.string(body, "leaseToken"));
        const { task } = await s.leases.releaseTask({
          ...lease,
          checkpointHandle: field.string(body, "checkpointHandle") ?? "",
        });
        return [200, await s.taskJson(required0(task))];
      },
    ),

    route(
      ["PATCH"],
      "/tasks/{id}/status",
      [
        "LeaseService/StartTask",
        "LeaseService/CompleteTask",
        "LeaseService/FailTask",
        "LeaseService/ReleaseTask",
      ],
      "report a task's status",
      async (s, _req, m) => {
        const body = await s.json([
          "status",
          "leaseToken",
          "resultSummary",
          "resultHandle",
          "resultValue",
          "errorCode",
          "checkpointHandle",
        ]);
        const status = field.string(body, "status");
        const to = status === undefined ? undefined : reportable[status.toLowerCase()];
        if (to === undefined) {
          throw invalid("status must be Running, Succeeded, Failed or Pending");
        }
        const handle = field.string(body, "resultHandle");
        if (handle !== undefined && to !== TaskState.SUCCEEDED) {
          throw invalid("resultHandle is taken only with status Succeeded");
        }
        const value = field.object(body, "resultValue") as JsonObject | undefined;
        if (value !== undefined && to !== TaskState.SUCCEEDED) {
          throw invalid("resultValue is taken only with status Succeeded");
        }
        const result = handle === undefined ? undefined : await resultOf(s, handle);
        const lease = leaseRef(m[1] ?? "", field.string(body, "leaseToken"));
        const summary = field.string(body, "resultSummary") ?? "";
        let task: Task | undefined;
        if (to === TaskState.RUNNING) {
          ({ task } = await s.leases.startTask(lease));
        } else if (to === TaskState.SUCCEEDED) {
          ({ task } = await s.leases.completeTask({
            ...lease,
            result,
            resultSummary: summary,
            resultValue: value,
          }));
        } else if (to === TaskState.FAILED) {
          // A director retries a failed task itself (POST .../retry).
          ({ task } = await s.leases.failTask({
            ...lease,
            errorCode: field.string(body, "errorCode") ?? "Failed",
            errorMessage: summary,
            retryable: false,
          }));
        } else {
          ({ task } = await s.leases.releaseTask({
            ...lease,
            checkpointHandle: field.string(body, "checkpointHandle") ?? "",
          }));
        }
        return [200, await s.taskJson(required0(task))];
      },
    ),
  ];
}

const artifactPath = /^\/artifacts\/([0-9a-fA-F-]{36})\/download$/;

/**
 * The result a `resultHandle` names: an artifact id, or an artifact's uri
 * (its download URL). Anything else, a host file path above all, is
 * refused and never read.
 */
async function resultOf(s: Session, handle: string) {
  let artifactId = handle;
  let uri: string | undefined;
  if (!isUuid(handle)) {
    let url: URL | undefined;
    try {
      url = new URL(handle);
    } catch {
      url = undefined;
    }
    const id =
      url && /^https?:$/.test(url.protocol) ? artifactPath.exec(url.pathname)?.[1] : undefined;
    if (!id || !isUuid(id)) {
      throw invalid(
        "resultHandle must name an artifact stored by this coordinator (its artifact id or uri); a file path is never read",
      );
    }
    artifactId = id;
    uri = handle;
  }
  const { artifact } = await s.artifacts.getArtifact({ artifactId });
  if (!artifact) throw new Error("GetArtifact returned no artifact");
  return {
    artifactId: artifact.artifactId,
    uri: uri ?? artifact.uri,
    sha256: artifact.sha256,
    contentType: artifact.contentType,
  };
}
