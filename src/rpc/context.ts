import { type ContextValues, createContextKey, createContextValues } from "@connectrpc/connect";

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

/** A request's correlation id, and the one its caller sent ("" when generated). */
export interface Correlation {
  id: string;
  sent: string;
}

/** The context values every RPC starts with. */
export function correlationValues(correlation: Correlation): ContextValues {
  return createContextValues()
    .set(kCorrelationId, correlation.id)
    .set(kCorrelationSent, correlation.sent);
}
