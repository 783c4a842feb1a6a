import { create } from "@bufbuild/protobuf";
import type { ContextValues } from "@connectrpc/connect";
import type { ArtifactRef } from "../../gen/meshwork/v1/artifact_pb.js";
import {
  type CompleteTaskRequest,
  type CompletionResult,
  CompletionResultSchema,
} from "../../gen/meshwork/v1/lease_pb.js";
import type { Progress as ProgressMessage } from "../../gen/meshwork/v1/task_pb.js";
import type { Guard } from "../auth/guard.js";
import { callerOf } from "../auth/principal.js";
import { DomainError, invalid } from "../core/errors.js";
import { type LeaseFields, type LeaseRef, leaseToken, parseLeaseRef } from "../core/lease-ref.js";
import { intInRange, shallowJson, text, uuidField } from "../core/validate.js";
import type { ArtifactRefJson } from "../db/schema/index.js";
import type { Completion, LeaseStore, Progress } from "./store.js";

// What a lease-bound request names and asks, parsed for LeaseService: the
// lease (by its fields, or by its token alone), progress, a completion.

/**
 * The lease a lease-bound request names: by its fields, or by task_id and
 * lease_token alone (worker_id empty, attempt 0), whose holder and attempt
 * are looked up (a token names one attempt of one task) and, for a worker
 * token, must be one of its own workers. The statement that follows
 * checks every rule again, the token included, so a lease that changed
 * hands between the two is refused there.
 */
export function createLeaseNamer(app: {
  leases: Pick<LeaseStore, "leaseByToken">;
  guard: Pick<Guard, "actsFor">;
}): (req: LeaseFields, values: ContextValues) => Promise<LeaseRef> {
  return async (req, values) => {
    if (req.workerId !== "" || req.attempt !== 0 || req.leaseToken === "") {
      return parseLeaseRef(req);
    }
    const taskId = uuidField("task_id", req.taskId);
    const token = leaseToken("lease_token", req.leaseToken);
    const lease = await app.leases.leaseByToken(taskId, token);
    if (!lease) {
      throw new DomainError(
        "aborted",
        "TOKEN_MISMATCH",
        `lease_token does not name a lease of task ${taskId}`,
        { taskId },
      );
    }
    await app.guard.actsFor(callerOf(values), [lease.workerId]);
    return { taskId, workerId: lease.workerId, attempt: lease.attempt, token };
  };
}

/** The progress a renewal reports, bounded. */
export function progressOf(p: ProgressMessage | undefined): Progress | undefined {
  if (!p) return undefined;
  return {
    completedSteps: intInRange("progress.completed_steps", p.completedSteps, 0, 2_000_000_000),
    message: p.message.slice(0, 1024),
  };
}

/**
 * A result must name coordinator-owned bytes: the `uri` is the download URL
 * this coordinator issues for `artifact_id`. Host paths, `file://`,
 * `worker://` and other hosts are refused. That the artifact exists and is
 * one of this attempt's, with this sha256, the completion checks in its
 * statement (leases/sql/complete.ts).
 */
function resultRef(
  ref: ArtifactRef | undefined,
  publicUrl: string,
  field: string,
): ArtifactRefJson | null {
  if (!ref) return null;
  const id = uuidField(`${field}result.artifact_id`, ref.artifactId);
  const issued = `${publicUrl}/artifacts/${id}/download`;
  if (ref.uri !== issued) {
    throw invalid(
      `${field}result.uri must be the coordinator-issued download URL ${issued}`,
      "FOREIGN_URI",
    );
  }
  if (!/^[0-9a-f]{64}$/.test(ref.sha256))
    throw invalid(`${field}result.sha256 must be 64 lowercase hex digits`);
  if (ref.sizeBytes < 0n) throw invalid(`${field}result.size_bytes must not be negative`);
  return {
    artifactId: id,
    uri: ref.uri,
    sha256: ref.sha256,
    sizeBytes: Number(ref.sizeBytes),
    contentType: text(`${field}result.content_type`, ref.contentType, { optional: true }),
  };
}

export function completionOf(
  req: CompleteTaskRequest,
  lease: LeaseRef,
  publicUrl: string,
  field = "",
): Completion {
  const metrics = Object.entries(req.metrics);
  if (metrics.length > 100) throw invalid(`${field}metrics has more than 100 entries`);
  for (const [k, v] of metrics) {
    text(`${field}metrics key`, k);
    if (!Number.isFinite(v)) throw invalid(`${field}metrics[${k}] must be a finite number`);
  }
  if (req.resultSummary.length > 4096)
    throw invalid(`${field}result_summary is longer than 4096 characters`);
  return {
    ...lease,
    result: resultRef(req.result, publicUrl, field),
    summary: req.resultSummary,
    metrics: req.metrics,
    value: resultValueOf(req.resultValue, `${field}result_value`),
  };
}

/** The most a result_value may take, as JSON text. */
export const maxResultValueBytes = 64 * 1024;

/** A completion's result_value, checked: at most 64 KiB as JSON, nested as parameters may be. */
function resultValueOf(value: CompleteTaskRequest["resultValue"], field: string) {
  if (value === undefined) return null;
  const bytes = Buffer.byteLength(JSON.stringify(value));
  if (bytes > maxResultValueBytes) {
    throw invalid(`${field} is ${bytes} bytes as JSON, over the ${maxResultValueBytes} allowed`);
  }
  return shallowJson(field, value as Record<string, unknown>);
}

/** A refused completion of a batch, as CompleteTasks answers it. */
export function errorResult(error: DomainError): CompletionResult {
  return create(CompletionResultSchema, {
    outcome: {
      case: "error",
      value: {
        code: error.kind,
        reason: error.reason,
        message: error.message,
      },
    },
  });
}
