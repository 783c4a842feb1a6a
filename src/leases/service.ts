import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  CompletionResultSchema,
  type LeaseService,
  LeaseStatus,
  type LeaseUpdate,
  LeaseUpdateSchema,
} from "../../gen/meshwork/v1/lease_pb.js";
import type { ArtifactStore } from "../artifacts/store.js";
import type { Guard } from "../auth/guard.js";
import type { Config } from "../config.js";
import { DomainError, invalid } from "../core/errors.js";
import { type LeaseRef, leaseToken, parseLeaseRef } from "../core/lease-ref.js";
import { linkedSignal } from "../core/signals.js";
import { attemptField, intInRange, isUuid, stringList, text, uuidField } from "../core/validate.js";
import { isTransientDatabaseError } from "../db/faults.js";
import type { WorkerCache } from "../fleet/cache.js";
import type { HeartbeatBuffer } from "../fleet/heartbeats.js";
import { parseLogLine } from "../logs/lines.js";
import type { LogTail } from "../logs/tail.js";
import type { Metrics } from "../metrics/metrics.js";
import { toTask } from "../tasks/convert.js";
import type { TaskStore } from "../tasks/store.js";
import { toClaim } from "./convert.js";
import { completionOf, createLeaseNamer, errorResult, progressOf } from "./requests.js";
import { sanitizeMessage } from "./sanitize.js";
import type { ClaimAnswer, Completion, LeaseStore, Outcome } from "./store.js";
import type { Baton, ClaimWakeups } from "./wakeup.js";

/** What LeaseService uses. */
export interface LeaseServiceDeps {
  config: Pick<Config, "publicUrl">;
  /** The dependency outputs a claim hands over. */
  tasks: Pick<TaskStore, "dependencyOutputs">;
  leases: LeaseStore;
  /**
   * The lease store on the database's urgent lane (db/pool-gate.ts): the
   * renewals of what workers hold, which a burst of claims must not hold
   * up (`complete` runs its statements on the same lane).
   */
  urgent: { leases: Pick<LeaseStore, "renew" | "renewMany"> };
  /**
   * Completes a call's completions, in one statement with those of the
   * CompleteTask and CompleteTasks calls made together (group commit).
   */
  complete(completions: Completion[]): Promise<Outcome[]>;
  workerCache: Pick<WorkerCache, "get">;
  heartbeats: Pick<HeartbeatBuffer, "touch">;
  wakeups: Pick<ClaimWakeups, "arm" | "passOn">;
  events: { emit(taskIds: Iterable<string>): void };
  artifacts: Pick<ArtifactStore, "get">;
  /** A worker token acts only for its own workers (auth/guard.ts): checked for a lease named by its token. */
  guard: Pick<Guard, "actsFor">;
  shutdownSignal: AbortSignal;
  metrics: Pick<Metrics, "claims" | "completions" | "completionRepeats" | "failures">;
  /** Task log tails (src/logs/): AppendLogs, and the lines of StreamLeases messages. */
  logTail: Pick<LogTail, "append" | "appendStream">;
}

/**
 * Runs `fn` again after a transient database failure (a pool exhausted for
 * a moment, a failover), twice at most, 250 ms and then 750 ms later: a
 * stream's renewals are safe to send again, and a worker whose stream ends
 * must open another before its leases run out. What still fails ends the
 * stream with `unavailable`.
 */
async function retryTransient<T>(fn: () => Promise<T>): Promise<T> {
  for (const pause of [250, 750]) {
    try {
      return await fn();
    } catch (error) {
      if (!isTransientDatabaseError(error)) throw error;
      await new Promise((r) => setTimeout(r, pause));
    }
  }
  return fn();
}

/** The cap a claim of a worker without a limit is given: above any count of live leases. */
const noLimit = 2_000_000_000;

/** How long a StreamLeases stream trusts the drained flag it last read. */
const drainedRecheckMs = 5000;

/**
 * A checkpoint handle that names an artifact must name a CHECKPOINT of this
 * task; any other string is opaque and kept as it is.
 */
async function checkCheckpoint(
  app: Pick<LeaseServiceDeps, "artifacts">,
  lease: LeaseRef,
  handle: string,
): Promise<void> {
  if (!isUuid(handle)) return;
  const row = await app.artifacts.get(handle.toLowerCase()).catch((error: unknown) => {
    if (error instanceof DomainError && error.kind === "not_found") return undefined;
    throw error;
  });
  if (row && (row.taskId !== lease.taskId || row.kind !== "CHECKPOINT")) {
    throw new DomainError(
      "aborted",
      "ARTIFACT_MISMATCH",
      `checkpoint_handle names artifact ${row.id}, which is not a CHECKPOINT of task ${lease.taskId}`,
      { taskId: lease.taskId },
    );
  }
}

/**
 * LeaseService: claims with long polling, StartTask for pushed tasks,
 * renewals (unary and streamed), completions (one or a batch), failures and
 * releases.
 */
export function createLeaseService(app: LeaseServiceDeps): ServiceImpl<typeof LeaseService> {
  const publicUrl = app.config.publicUrl;
  /** Each task's completion counts once; an identical repeat, accepted again, counts apart. */
  const countCompletion = (o: { ok: { workload: string }; repeat?: boolean }) =>
    (o.repeat ? app.metrics.completionRepeats : app.metrics.completions).inc({
      workload: o.ok.workload,
    });
  const leaseNamed = createLeaseNamer(app);
  return {
    async claimTasks(req, ctx) {
      const workerId = uuidField("worker_id", req.workerId);
      const max = req.maxTasks === 0 ? 1 : intInRange("max_tasks", req.maxTasks, 1, 100);
      const waitSeconds = intInRange("wait_seconds", req.waitSeconds, 0, 30);
      const capabilities = stringList("capabilities", req.capabilities, 1000);
      const maxConcurrency =
        req.maxConcurrency === undefined
          ? undefined
          : intInRange("max_concurrency", req.maxConcurrency, 1, 10_000);
      const worker = await app.workerCache.get(workerId);
      app.heartbeats.touch(workerId);
      // A worker without a limit (max_concurrency 0) claims up to max_tasks:
      // the claim's cap stands far above any count of leases.
      const unlimited = maxConcurrency === undefined && worker.maxConcurrency === 0;
      const claiming = {
        id: workerId,
        capabilities: capabilities.length > 0 ? capabilities : worker.capabilities,
        labels: worker.labels,
        maxConcurrency: unlimited ? noLimit : maxConcurrency,
      };
      // The answer, with the cap and the slots left after the claims, which
      // the claim's statement counts (a separate count only when it did not:
      // a drained worker, a caller that gave up). Leases already granted are
      // never lost to a failed count: they are answered without free_slots
      // (the cap as last read) rather than not at all, which would leave
      // them running out unused.
      const answer = async ({ rows, slots }: ClaimAnswer) => {
        app.events.emit(rows.map((r) => r.id));
        for (const r of rows) app.metrics.claims.inc({ workload: r.workload });
        // Granted leases whose outputs cannot be read are not answered: they
        // run out and are claimed again, never run without their inputs.
        const outputs = await app.tasks.dependencyOutputs(rows);
        const claims = rows.map((r) => toClaim(r, outputs.get(r.id)));
        if (unlimited) return { claims, maxConcurrency: 0 };
        try {
          const counted = slots ?? (await app.leases.slots(claiming));
          return { claims, freeSlots: counted.free, maxConcurrency: counted.maxConcurrency };
        } catch (error) {
          if (rows.length === 0) throw error;
          return { claims, maxConcurrency: maxConcurrency ?? worker.maxConcurrency };
        }
      };
      const nothing: ClaimAnswer = { rows: [], slots: undefined };
      if (worker.drained) return answer(nothing);
      const linked = linkedSignal(ctx.signal, app.shutdownSignal);
      const { signal } = linked;
      const deadline = Date.now() + waitSeconds * 1000;
      const claimer = { capabilities: claiming.capabilities, max };
      // Why the last wake-up came; handed on when this claim found nothing.
      let baton: Baton | undefined;
      const handOn = (got: number) => {
        if (baton && got === 0) app.wakeups.passOn(baton);
        baton = undefined;
      };
      try {
        for (;;) {
          // Armed before the claim: a task created while it runs still wakes us.
          const armed = app.wakeups.arm(deadline - Date.now(), signal, claimer);
          const claimed = await app.leases.claimCounted(claiming, max);
          handOn(claimed.rows.length);
          if (claimed.rows.length > 0 || Date.now() >= deadline || signal.aborted) {
            armed.cancel();
            return answer(claimed);
          }
          baton = await armed.fired;
          // The caller gave up (it cancelled the call, or its deadline passed):
          // whatever were claimed now would go to nobody and sit leased until
          // its lease ran out.
          if (ctx.signal.aborted) {
            handOn(0);
            return answer(nothing);
          }
          if (Date.now() >= deadline || signal.aborted) {
            // One last look, so that a wake-up at the deadline is not wasted.
            const last = await app.leases.claimCounted(claiming, max);
            handOn(last.rows.length);
            return answer(last);
          }
        }
      } finally {
        linked.dispose();
      }
    },

    async startTask(req, ctx) {
      const lease = await leaseNamed(req, ctx.values);
      app.heartbeats.touch(lease.workerId);
      const row = await app.leases.start(lease);
      app.events.emit([row.id]);
      // A pushed task's worker learns its inputs here, as a claim's does.
      const outputs = await app.tasks.dependencyOutputs([row]);
      return { task: toTask(row, false, outputs.get(row.id)) };
    },

    async renewLease(req, ctx) {
      const lease = await leaseNamed(req, ctx.values);
      const extend =
        req.extendSeconds === undefined
          ? undefined
          : intInRange("extend_seconds", req.extendSeconds, 60, 86_400);
      const progress = progressOf(req.progress);
      app.heartbeats.touch(lease.workerId);
      const renewed = await app.urgent.leases.renew(lease, extend, progress);
      if (progress) app.events.emit([lease.taskId]);
      return {
        leaseExpiresAt: timestampFromDate(renewed.leaseExpiresAt ?? new Date()),
        cancelRequested: renewed.cancelRequested,
        task: toTask(renewed),
      };
    },

    async *streamLeases(requests, ctx) {
      let workerId: string | undefined;
      let drained = false;
      let drainedReadAt = 0;
      const linked = linkedSignal(ctx.signal, app.shutdownSignal);
      const { signal } = linked;
      try {
        for await (const req of requests) {
          if (signal.aborted) return;
          const id = uuidField("worker_id", req.workerId);
          if (workerId !== undefined && id !== workerId) {
            throw invalid("worker_id must stay the same on one stream");
          }
          if (req.leases.length > 1000) throw invalid("leases must hold at most 1000 entries");
          if (req.logs.length > 1000) throw invalid("logs must hold at most 1000 entries");
          const logs = req.logs.map((l, i) => parseLogLine(l, `logs[${i}].`, id));
          const queueDepth =
            req.queueDepth === undefined
              ? undefined
              : intInRange("queue_depth", req.queueDepth, 0, 2_000_000_000);
          if (workerId === undefined) {
            drained = (await app.workerCache.get(id)).drained;
            drainedReadAt = Date.now();
            workerId = id;
          } else if (Date.now() - drainedReadAt > drainedRecheckMs) {
            // From the worker cache, shared with the worker's claims and its
            // other streams. A read that fails keeps the last answer rather
            // than ending the stream (and its leases); the next message tries again.
            try {
              drained = (await app.workerCache.get(id)).drained;
              drainedReadAt = Date.now();
            } catch (error) {
              if (!isTransientDatabaseError(error)) throw error;
            }
          }
          app.heartbeats.touch(id, queueDepth);
          const items = req.leases.map((l, i) => ({
            taskId: uuidField(`leases[${i}].task_id`, l.taskId),
            attempt: attemptField(`leases[${i}].attempt`, l.attempt),
            token: leaseToken(`leases[${i}].lease_token`, l.leaseToken),
            progress: progressOf(l.progress),
          }));
          const outcomes = await retryTransient(() => app.urgent.leases.renewMany(id, items));
          const leases: LeaseUpdate[] = outcomes.map((o, i) => {
            const { taskId, attempt } = items[i] as (typeof items)[number];
            if ("ok" in o) {
              return create(LeaseUpdateSchema, {
                taskId,
                attempt,
                status: LeaseStatus.RENEWED,
                expiresAt: timestampFromDate(o.ok),
              });
            }
            // A cancel and a timeout both mean: stop the work now.
            const canceled = o.error.reason === "TASK_CANCELED" || o.error.reason === "TIMEOUT";
            return create(LeaseUpdateSchema, {
              taskId,
              attempt,
              status: canceled ? LeaseStatus.CANCELED : LeaseStatus.LOST,
              reason: o.error.reason,
            });
          });
          app.events.emit(items.filter((i) => i.progress).map((i) => i.taskId));
          // After the renewals: lines of a lease just lost are dropped by the lease check.
          if (logs.length > 0) await retryTransient(() => app.logTail.append(logs));
          yield { leases, drained };
        }
      } finally {
        linked.dispose();
      }
    },

    async completeTask(req, ctx) {
      const [outcome] = await app.complete([
        completionOf(req, await leaseNamed(req, ctx.values), publicUrl),
      ]);
      if (!outcome) throw new Error("complete returned no outcome");
      if ("error" in outcome) throw outcome.error;
      countCompletion(outcome);
      app.events.emit([outcome.ok.id]);
      return { task: toTask(outcome.ok) };
    },

    async completeTasks(req) {
      if (req.completions.length === 0 || req.completions.length > 1000) {
        throw invalid(`completions must hold 1 to 1000 entries, not ${req.completions.length}`);
      }
      const parsed = req.completions.map((c, i) => {
        try {
          const field = `completions[${i}].`;
          return completionOf(c, parseLeaseRef(c, field), publicUrl, field);
        } catch (error) {
          if (error instanceof DomainError) return error;
          throw error;
        }
      });
      const valid = parsed.filter((p): p is Completion => !(p instanceof DomainError));
      const outcomes = valid.length > 0 ? await app.complete(valid) : [];
      let next = 0;
      const results = parsed.map((p) => {
        if (p instanceof DomainError) return errorResult(p);
        const o = outcomes[next++];
        if (!o) throw new Error("complete returned too few outcomes");
        if ("error" in o) return errorResult(o.error);
        countCompletion(o);
        return create(CompletionResultSchema, { outcome: { case: "task", value: toTask(o.ok) } });
      });
      app.events.emit(valid.map((c) => c.taskId));
      return { results };
    },

    async failTask(req, ctx) {
      const lease = await leaseNamed(req, ctx.values);
      const code = text("error_code", req.errorCode, { optional: true }).slice(0, 128) || "ERROR";
      const row = await app.leases.fail(
        lease,
        code,
        sanitizeMessage(req.errorMessage),
        req.retryable ?? true,
      );
      app.metrics.failures.inc({
        workload: row.workload,
        outcome: row.state === "PENDING" ? "retry" : "failed",
      });
      app.events.emit([row.id]);
      return { task: toTask(row) };
    },

    async releaseTask(req, ctx) {
      const lease = await leaseNamed(req, ctx.values);
      if (req.checkpointHandle.length > 4096) {
        throw invalid("checkpoint_handle is longer than 4096 characters");
      }
      await checkCheckpoint(app, lease, req.checkpointHandle);
      const row = await app.leases.release(lease, req.checkpointHandle);
      app.events.emit([row.id]);
      return { task: toTask(row) };
    },

    appendLogs: (lines) => app.logTail.appendStream(lines),
  };
}
