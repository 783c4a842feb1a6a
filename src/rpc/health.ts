import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import {
  type Health,
  HealthCheckResponse_ServingStatus as Status,
} from "../../gen/grpc/health/v1/health_pb.js";
import { linkedSignal } from "../core/signals.js";

/**
 * grpc.health.v1.Health. The overall status ("") and each named service are
 * SERVING while the database answers, NOT_SERVING otherwise; an unknown
 * service name is `not_found`, as the protocol asks.
 */
export function createHealthService(
  services: string[],
  databaseReady: () => Promise<boolean>,
  shutdownSignal: AbortSignal,
): ServiceImpl<typeof Health> {
  const known = new Set(["", ...services]);
  const status = async (service: string) => {
    if (!known.has(service)) throw new ConnectError(`unknown service ${service}`, Code.NotFound);
    if (shutdownSignal.aborted) return Status.NOT_SERVING;
    return (await databaseReady()) ? Status.SERVING : Status.NOT_SERVING;
  };
  return {
    async check(req) {
      return { status: await status(req.service) };
    },
    async *watch(req, ctx) {
      const linked = linkedSignal(ctx.signal, shutdownSignal);
      const { signal } = linked;
      let last: Status | undefined;
      try {
        while (!signal.aborted) {
          const now = known.has(req.service) ? await status(req.service) : Status.SERVICE_UNKNOWN;
          if (now !== last) {
            last = now;
            yield { status: now };
          }
          await new Promise<void>((resolve) => {
            const done = () => {
              clearTimeout(timer);
              signal.removeEventListener("abort", done);
              resolve();
            };
            const timer = setTimeout(done, 5000);
            signal.addEventListener("abort", done, { once: true });
          });
        }
      } finally {
        linked.dispose();
      }
    },
  };
}
