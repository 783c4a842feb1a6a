import type { JsonObject } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { codeFromString } from "@connectrpc/connect/protocol-connect";
import type { ArtifactRef } from "../../gen/meshwork/v1/artifact_pb.js";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";
import type { CompleteTaskRequest } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskError } from "./errors.js";
import { fail } from "./report.js";
import { isLeaseRefusal, isTransient, reasonOf, retrying } from "./rpc.js";
import { endLease, type Running, refusedLease, type Session, underLease } from "./session.js";
import { traceHeaders } from "./trace.js";
import type { TaskResult } from "./types.js";

/** The most a result value may take, as JSON text (CompleteTaskRequest.result_value). */
export const maxResultValueBytes = 64 * 1024;

/**
 * A handler's result value as it will be sent: a plain object made JSON
 * (as JSON.stringify makes it), at most 64 KiB; else a TaskError, not
 * retried (ResultValueInvalid, ResultValueTooLarge).
 */
export function checkedValue(value: unknown): JsonObject | undefined {
  if (value === undefined || value === null) return undefined;
  const invalid = (why: string) =>
    new TaskError("ResultValueInvalid", `the result value ${why}`, { retryable: false });
  if (typeof value !== "object" || Array.isArray(value)) throw invalid("is not a JSON object");
  let text: string;
  try {
    text = JSON.stringify(value);
  } catch (error) {
    throw invalid(`cannot be made JSON: ${(error as Error).message}`);
  }
  const json: unknown = JSON.parse(text);
  if (json === null || typeof json !== "object" || Array.isArray(json)) {
    throw invalid("is not a JSON object");
  }
  const bytes = Buffer.byteLength(text);
  if (bytes > maxResultValueBytes) {
    throw new TaskError(
      "ResultValueTooLarge",
      `the result value is ${bytes} bytes as JSON, over the ${maxResultValueBytes} allowed`,
      { retryable: false },
    );
  }
  return json as JsonObject;
}

interface PendingCompletion {
  entry: Running;
  request: Omit<CompleteTaskRequest, "$typeName" | "result"> & { result?: ArtifactRef | undefined };
  settle: () => void;
}

/** A worker's completions: gathered for completionBatchMs, then one CompleteTask or CompleteTasks. */
export interface Completions {
  /** Queues the completion of a task whose handler returned; resolves once it was sent (or given up). */
  complete(entry: Running, result: TaskResult | undefined): Promise<void>;
  /** On stop: sends what is queued now rather than after the batch's wait. */
  flushNow(): Promise<void>;
}

export function createCompletions(s: Session): Completions {
  const { log } = s;
  const pending: PendingCompletion[] = [];
  let flushTimer: NodeJS.Timeout | undefined;

  const flush = async () => {
    flushTimer = undefined;
    const batch = pending.splice(0, 1000);
    if (pending.length > 0) flushTimer = setTimeout(flush, 0);
    if (batch.length === 0) return;
    const settleAll = () => {
      for (const p of batch) p.settle();
    };
    try {
      if (batch.length === 1) {
        await completeAlone(batch[0] as PendingCompletion);
        return;
      }
      let res: Awaited<ReturnType<typeof s.leases.completeTasks>>;
      try {
        res = await retrying(
          () =>
            s.leases.completeTasks(
              { completions: batch.map((p) => p.request) },
              { timeoutMs: s.timeoutMs, signal: s.hurry.signal },
            ),
          { signal: s.hurry.signal },
        );
      } catch (error) {
        if (isTransient(error)) throw error;
        // The batch as a whole was refused (a coordinator without
        // CompleteTasks, say): each completion goes alone, with its own answer.
        log(`CompleteTasks refused (${(error as Error).message}); completing one by one`);
        for (const p of batch) await completeAlone(p);
        return;
      }
      await Promise.all(
        batch.map(async (p, i) => {
          const outcome = res.results[i]?.outcome;
          if (outcome?.case === "task") {
            log(`task ${p.request.taskId} completed`);
            return;
          }
          // No answer for it: sent again alone (a completion is idempotent).
          if (outcome?.case !== "error") return completeAlone(p);
          // The same handling as a lone CompleteTask's error.
          const { code, reason, message } = outcome.value;
          const error = new ConnectError(
            message,
            codeFromString(code) ?? Code.Unknown,
            undefined,
            reason ? [{ desc: ErrorInfoSchema, value: { reason } }] : [],
          );
          if (isTransient(error)) return completeAlone(p); // with its retries
          if (isLeaseRefusal(error)) endLease(s, p.entry, refusedLease(reason));
          await refused(p.entry, error);
        }),
      );
    } catch (error) {
      log(`completing ${batch.length} tasks failed: ${(error as Error).message}`);
    } finally {
      settleAll();
    }
  };

  /** One CompleteTask with its retries; a refusal fails the task or drops it when the lease is gone. */
  const completeAlone = async (p: PendingCompletion) => {
    try {
      await underLease(s, p.entry, () =>
        retrying(
          () =>
            s.leases.completeTask(p.request, {
              timeoutMs: s.timeoutMs,
              signal: s.hurry.signal,
              headers: traceHeaders(p.entry.claim),
            }),
          { signal: s.hurry.signal },
        ),
      );
      log(`task ${p.request.taskId} completed`);
    } catch (error) {
      await refused(p.entry, error);
    }
  };

  const refused = async (entry: Running, error: unknown) => {
    if (entry.ended) {
      log(`task ${entry.claim.taskId}: the lease is gone (${reasonOf(error)}); completion dropped`);
      return;
    }
    log(`task ${entry.claim.taskId}: completion failed: ${(error as Error).message}`);
    if (!isTransient(error)) {
      // A result the coordinator finds invalid (a summary too long, too many
      // metrics) would be refused again: another attempt cannot help.
      const retryable = !(error instanceof ConnectError && error.code === Code.InvalidArgument);
      await fail(
        s,
        entry,
        new TaskError("CompletionRefused", (error as Error).message, { retryable }),
      );
    }
  };

  return {
    complete(entry, result) {
      const { claim } = entry;
      const ref = result?.result;
      return new Promise((settle) => {
        pending.push({
          entry,
          settle,
          request: {
            taskId: claim.taskId,
            workerId: s.workerId,
            attempt: claim.attempt,
            leaseToken: claim.leaseToken,
            result: ref && {
              $typeName: "meshwork.v1.ArtifactRef",
              artifactId: ref.artifactId,
              uri: ref.uri,
              sha256: ref.sha256,
              sizeBytes: 0n,
              contentType: "",
            },
            resultSummary: result?.summary ?? "",
            metrics: result?.metrics ?? {},
            // Made JSON and checked by checkedValue before the handler's completion came here.
            resultValue: result?.value as JsonObject | undefined,
          },
        });
        flushTimer ??= setTimeout(flush, s.batchMs);
      });
    },
    async flushNow() {
      if (flushTimer) {
        clearTimeout(flushTimer);
        await flush();
      }
    },
  };
}
