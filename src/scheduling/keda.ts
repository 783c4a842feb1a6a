import type { ServiceImpl } from "@connectrpc/connect";
import type {
  ExternalScaler,
  ScaledObjectRef,
} from "../../gen/externalscaler/externalscaler_pb.js";
import { invalid } from "../core/errors.js";
import { linkedSignal } from "../core/signals.js";
import { text } from "../core/validate.js";
import type { Db } from "../db/database.js";
import { type Demand, type Pool, parseCapacity, parseSelector, readDemand } from "./demand.js";

/** The metric KEDA scales on: workers of the pool's capacity that its work needs. */
export const workersNeededMetric = "meshwork_workers_needed";
/** The other metric GetMetrics answers: the age of the pool's oldest PENDING task, in seconds. */
export const backlogAgeMetric = "meshwork_backlog_age_seconds";

/**
 * The pool a ScaledObject's trigger metadata names: `workload` (required),
 * `selector` (`key=value,key in (a|b)`: the labels its workers carry) and
 * `workerCapacity` (`cpu=4000,memory=16384,gpu=1`: one worker's capacity;
 * none: one task per worker).
 */
export function poolOf(ref: ScaledObjectRef | undefined): Pool {
  const meta = ref?.scalerMetadata ?? {};
  const workload = meta.workload ?? "";
  if (workload === "") throw invalid("scalerMetadata.workload is required");
  return {
    workload: text("scalerMetadata.workload", workload),
    selector: parseSelector(meta.selector ?? ""),
    capacity: parseCapacity(meta.workerCapacity ?? ""),
  };
}

/** How often StreamIsActive looks again. */
const streamCheckMs = 2000;

/**
 * KEDA's external scaler (package externalscaler): read-only demand
 * figures for one pool per call (scheduling/demand.ts), nothing else. It is
 * served on its own listener (--keda-listen), without bearer tokens: KEDA
 * authenticates an external scaler by TLS only (docs/scheduling.md).
 */
export function createKedaScaler(deps: {
  db: Db;
  shutdownSignal: AbortSignal;
}): ServiceImpl<typeof ExternalScaler> {
  const demand = (ref: ScaledObjectRef | undefined): Promise<Demand> =>
    readDemand(deps.db, poolOf(ref));
  const active = (d: Demand) => d.pending + d.leased > 0;
  return {
    async isActive(req) {
      return { result: active(await demand(req)) };
    },

    async *streamIsActive(req, ctx) {
      const pool = poolOf(req);
      const linked = linkedSignal(ctx.signal, deps.shutdownSignal);
      try {
        let last: boolean | undefined;
        while (!linked.signal.aborted) {
          const now = active(await readDemand(deps.db, pool));
          if (now !== last) yield { result: now };
          last = now;
          await new Promise<void>((resolve) => {
            const timer = setTimeout(done, streamCheckMs);
            linked.signal.addEventListener("abort", done, { once: true });
            function done() {
              clearTimeout(timer);
              linked.signal.removeEventListener("abort", done);
              resolve();
            }
          });
        }
      } finally {
        linked.dispose();
      }
    },

    async getMetricSpec(req) {
      poolOf(req);
      return {
        metricSpecs: [{ metricName: workersNeededMetric, targetSize: 1n, targetSizeFloat: 1 }],
      };
    },

    async getMetrics(req) {
      const d = await demand(req.scaledObjectRef);
      // KEDA may prefix the name it was given: the suffix says which.
      const age = req.metricName.endsWith(backlogAgeMetric);
      const value = age ? d.backlogAgeSeconds : d.workersNeeded;
      return {
        metricValues: [
          {
            metricName: req.metricName || workersNeededMetric,
            metricValue: BigInt(Math.ceil(value)),
            metricValueFloat: value,
          },
        ],
      };
    },
  };
}
