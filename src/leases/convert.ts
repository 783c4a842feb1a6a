import type { Claim } from "../../gen/meshwork/v1/lease_pb.js";
import { timestamp, toArtifactRef, toQuantities } from "../tasks/convert.js";
import type { ClaimedRow } from "./claim.js";

/**
 * What a worker needs to run a task it just claimed, with the lease token.
 * A literal of the generated type, as toTask's (tasks/convert.ts).
 */
export function toClaim(row: ClaimedRow, outputs: Record<string, string> = {}): Claim {
  return {
    $typeName: "meshwork.v1.Claim",
    taskId: row.id,
    attempt: row.attempt,
    leaseToken: row.leaseToken ?? "",
    leaseExpiresAt: row.leaseExpiresAt ? timestamp(row.leaseExpiresAt) : undefined,
    workload: row.workload,
    input: toArtifactRef(row.input),
    parameters: (row.parameters ?? undefined) as Claim["parameters"],
    checkpointHandle: row.checkpointHandle,
    correlationId: row.correlationId,
    steps: row.steps ?? undefined,
    name: row.name,
    leaseSeconds: row.leaseSeconds,
    traceparent: row.traceParent,
    tracestate: row.traceState,
    resources: toQuantities(row.resources),
    dependencyOutputs: outputs,
    timeoutSeconds: row.timeoutSeconds ?? 0,
  };
}
