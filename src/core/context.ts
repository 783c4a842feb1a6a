import { type ContextValues, createContextKey, createContextValues } from "@connectrpc/connect";
import type { TraceContext } from "../tracing/context.js";

// The context values of a request that every layer may read: the services
// record them (ScheduleTask keeps the caller's correlation id and trace),
// the interceptors and the plain routes set them. Here, under the features,
// so that a service reads them without importing the RPC plumbing.

/** The request's correlation id: read from `x-correlation-id` or generated. */
export const kCorrelationId = createContextKey<string>("", { description: "correlation id" });

/**
 * The correlation id the caller sent (`x-correlation-id`, or
 * `X-Ashlar-Correlation-Id`), or "" when it was generated: schedule and
 * retry record a correlation id only when one is given.
 */
export const kCorrelationSent = createContextKey<string>("", {
  description: "correlation id sent by the caller",
});

/**
 * The request's W3C trace context (tracing/context.ts): read from
 * `traceparent`/`tracestate` or made for the request, then given the RPC's
 * span by the logging interceptor. Undefined only before that interceptor
 * (in-memory transports that set no context values).
 */
export const kTrace = createContextKey<TraceContext | undefined>(undefined, {
  description: "trace context",
});

/** A request's correlation id, the one its caller sent ("" when generated), and its trace context. */
export interface Correlation {
  id: string;
  sent: string;
  /** From the request's `traceparent`/`tracestate` headers (server.ts). */
  trace?: TraceContext | undefined;
}

/** The context values every RPC starts with. */
export function correlationValues(correlation: Correlation): ContextValues {
  return createContextValues()
    .set(kCorrelationId, correlation.id)
    .set(kCorrelationSent, correlation.sent)
    .set(kTrace, correlation.trace);
}
